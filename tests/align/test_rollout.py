"""Rollouts: groups from the generation engine, log-probs at the sampling temperature, DAPO drop-and-refill."""

from __future__ import annotations

import torch

from scratchlm.align.grpo import preset
from scratchlm.align.grpo_trainer import GRPOTrainConfig, collect_rollout
from scratchlm.align.rollout import sample_rollouts, score_rollout
from scratchlm.align.toy_task import addition_prompts, byte_tokenizer, toy_model_config
from scratchlm.align.trainer_common import index_batches
from scratchlm.data.align_data import RLPrompt
from scratchlm.generate.sampling import SamplingParams, process_logits
from scratchlm.model import TransformerLM


def _model(tok):
    torch.manual_seed(0)
    return TransformerLM(toy_model_config(tok.vocab_size, d_model=32, n_layers=1)).eval()


def test_rollout_groups_rewards_and_truncation():
    tok, ex = byte_tokenizer(), addition_prompts(2)
    model = _model(tok)
    ro = sample_rollouts(model, tok, ex, [0, 4], group_size=3, max_new_tokens=3, temperature=1.0, seed=0)
    eot = tok.special_token_ids["<|endoftext|>"]
    assert ro.example_ids == [0, 0, 0, 4, 4, 4] and ro.prompts[3] == list(b"1+1=")
    for c, text, trunc, r, i in zip(ro.completions, ro.texts, ro.truncated, ro.rewards, ro.example_ids):
        assert bool(trunc) == (c[-1] != eot) and len(c) <= 3
        assert text == tok.decode(c if trunc else c[:-1])
        assert float(r) == float(text.strip() == ex[i].fields["answer"])
    again = sample_rollouts(model, tok, ex, [0, 4], 3, 3, 1.0, seed=0)
    assert again.completions == ro.completions  # seeded


def test_scored_logprobs_are_the_samplers_distribution():
    """log-probs at T equal log softmax of the engine's processed logits (temperature only) for each token."""
    tok, ex = byte_tokenizer(), addition_prompts(2)
    model = _model(tok)
    ro = sample_rollouts(model, tok, ex, [1, 2], 2, 3, temperature=0.7, seed=1)
    logp = score_rollout(model, ro, 0.7)
    params = SamplingParams(temperature=0.7)
    with torch.no_grad():
        for b, (p, c) in enumerate(zip(ro.prompts, ro.completions)):
            logits = model(torch.tensor([p + c]))[0]
            for j, t in enumerate(c):
                dist = torch.log_softmax(process_logits(logits[len(p) + j - 1][None].float(), params), -1)[0]
                assert torch.allclose(logp[b, j], dist[t], atol=1e-5)


def test_dynamic_sampling_keeps_only_informative_groups():
    tok = byte_tokenizer()
    # even prompts: reward 1 iff both sampled bytes are ASCII (about 1/4 of random completions: mixed groups);
    # odd prompts: "contains" the empty string, always 1, so their groups are always degenerate
    ex = [RLPrompt(f"{i}=", "regex_match", {"pattern": "[\\x00-\\x7f]*"}) if i % 2 == 0
          else RLPrompt(f"{i}=", "contains", {"answer": ""}) for i in range(10)]
    model = _model(tok)
    cfg = GRPOTrainConfig(prompts_per_step=3, group_size=4, max_new_tokens=2, max_refill_rounds=6,
                          loss=preset("dapo"))
    ro, info = collect_rollout(model, tok, ex, index_batches(len(ex), 3, 0), cfg, step=0)
    groups = ro.rewards.reshape(-1, 4)
    assert bool((groups != groups[:, :1]).any(1).all())  # no all-equal group survives
    assert info["groups"] == len(groups) == 3 and info["rounds"] >= 2  # some groups were dropped and refilled
    assert all(i % 2 == 0 for i in ro.example_ids)
    plain = GRPOTrainConfig(prompts_per_step=3, group_size=4, max_new_tokens=2, loss=preset("grpo"))
    ro2, info2 = collect_rollout(model, tok, ex, index_batches(len(ex), 3, 0), plain, step=0)
    assert len(ro2.prompts) == 12 and info2["rounds"] == 1


def test_grpo_training_is_reproducible_with_a_seed():
    from scratchlm.align.grpo_trainer import train_grpo
    from scratchlm.align.trainer_common import OptimConfig

    tok, ex = byte_tokenizer(), addition_prompts(2)
    runs = []
    for _ in range(2):
        model = _model(tok).train()
        cfg = GRPOTrainConfig(steps=3, prompts_per_step=2, group_size=4, max_new_tokens=2, seed=5,
                              loss=preset("grpo"), optim=OptimConfig(lr=1e-2))
        history = train_grpo(model, tok, ex, cfg, progress=False)
        runs.append((history, model.lm_head.weight.detach().clone()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


def test_mask_truncated_removes_truncated_completions_from_the_loss():
    from scratchlm.align.grpo_trainer import update_policy
    from scratchlm.align.rollout import Rollout
    from scratchlm.align.trainer_common import OptimConfig, Stepper

    tok = byte_tokenizer()
    ro = Rollout([[1, 2], [1, 2]], [[5, 6], [7, 8]], ["a", "b"], torch.tensor([1.0, 0.0]),
                 torch.tensor([True, True]), torch.tensor([2, 2]), [0, 0])
    adv = torch.tensor([1.0, -1.0])
    norms = {}
    for masked in (True, False):
        model = _model(tok).train()
        cfg = GRPOTrainConfig(group_size=2, max_new_tokens=2, loss=preset("dapo", mask_truncated=masked))
        m = update_policy(model, None, ro, adv, cfg, Stepper([model], OptimConfig(lr=1e-3), 1))
        norms[masked] = (m["grad_norm"], m["loss"])
    assert norms[True] == (0.0, 0.0) and norms[False][0] > 0
