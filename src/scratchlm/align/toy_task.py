"""A toy verifiable-reward task for demos and tests: small additions with a byte-level tokenizer.

Prompts are raw strings "a+b=" (a, b in [0, max_operand]); the reward is exact_match against str(a+b);
completions end with <|endoftext|>. The starting policy comes from a SHORT supervised warm-up that
stops once the model has half-learned the table (`stop_at_reward`, e.g. a mean sampled reward of 0.45);
RL must then move mass onto the correct answers, which it sees only through the reward. A fixed step
count does not give that start for every seed: after 120 steps at lr 1e-2 seed 0 samples 0.47, seed 3
0.76, seed 5 0.92 (little left to learn) and seeds 1 and 2 ~0.12 — a policy that ignores the prompt and
samples the answers' marginal (sum_s p(s)^2 = 85/625 = 0.136), from which an exact-match reward can only
sharpen it onto the most frequent sum (4: 5 of the 25 prompts, reward 0.2). At lr 3e-3 each of seeds 0-5
learned the whole table within 400 steps, so the warm-up stops on its way there (after 50-90 steps).
p_correct < 1 makes the warm-up answers noisy (correct with probability p_correct, else a random number
from the answer set).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from scratchlm.align.rollout import sample_rollouts
from scratchlm.align.sft import pad_examples, sft_loss
from scratchlm.align.trainer_common import OptimConfig, Stepper
from scratchlm.config import ModelConfig, get_preset
from scratchlm.data.align_data import RLPrompt, encode_completion, encode_prompt
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer


def byte_tokenizer() -> Tokenizer:
    """256 single-byte tokens, no merges, plus the default special tokens (vocab 259)."""
    return Tokenizer({i: bytes([i]) for i in range(256)}, [], list(DEFAULT_SPECIAL_TOKENS))


def addition_prompts(max_operand: int = 4) -> list[RLPrompt]:
    """Every "a+b=" with a, b in [0, max_operand], rewarded by exact_match on str(a + b)."""
    return [RLPrompt(f"{a}+{b}=", "exact_match", {"answer": str(a + b)})
            for a in range(max_operand + 1) for b in range(max_operand + 1)]


def toy_model_config(vocab_size: int, d_model: int = 64, n_layers: int = 2) -> ModelConfig:
    return get_preset("llama-tiny", vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=4,
                      n_kv_heads=2, max_seq_len=32)


def supervised_warmup(
    model: TransformerLM, tok: Any, examples: list[RLPrompt], steps: int = 150, p_correct: float = 0.4,
    batch_size: int = 64, lr: float = 3e-3, seed: int = 0, stop_at_reward: float | None = None,
    check_every: int = 10,
) -> list[float]:
    """Supervised warm-up on prompt + answer (correct with probability p_correct); returns the losses.

    stop_at_reward: stop after the first multiple of check_every steps at which the mean sampled reward
    (8 samples per prompt, T = 1, a sampling seed of its own so that later evaluations are not selected
    on the same noise) reaches it; at most `steps` steps (the cosine schedule's length)."""
    rng = random.Random(seed)
    answers = sorted({int(e.fields["answer"]) for e in examples})
    stepper = Stepper([model], OptimConfig(lr=lr, schedule="cosine", warmup_steps=10), steps)
    losses = []
    for step in range(steps):
        if stop_at_reward is not None and step and step % check_every == 0:
            if mean_reward(model, tok, examples, samples=8, seed=seed + 7919) >= stop_at_reward:
                break
        batch = []
        for _ in range(batch_size):
            ex = examples[rng.randrange(len(examples))]
            ans = ex.fields["answer"] if rng.random() < p_correct else str(rng.choice(answers))
            p, c = encode_prompt(tok, ex.prompt), encode_completion(tok, ex.prompt, ans)
            batch.append((p + c, [0] * len(p) + [1] * len(c)))
        ids, mask = (t.to(model.device) for t in pad_examples(batch))
        loss = sft_loss(model(ids), ids, mask)
        loss.backward()
        stepper.step()
        losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def mean_reward(model: TransformerLM, tok: Any, examples: list[RLPrompt], samples: int = 8,
                temperature: float = 1.0, max_new_tokens: int = 4, seed: int = 1234) -> float:
    """Mean task reward of `samples` sampled completions per prompt over all examples."""
    ro = sample_rollouts(model, tok, examples, list(range(len(examples))), samples, max_new_tokens,
                         temperature, seed=seed)
    return float(ro.rewards.mean())
