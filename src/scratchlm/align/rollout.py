"""Rollouts: sample G completions per prompt with the generation engine (batched, KV cache), decode and score.

Each prompt is repeated G times in one engine batch, so a group is G consecutive rows. A completion
keeps the end token that stopped it (it is an action the policy took and must be trained on); a
completion with no end token within max_new_tokens is `truncated`. Rewards are computed on the text
decoded WITHOUT the end token. Sampling uses only temperature (top_k = 0, top_p = 1 by default):
any truncation would make the sampler differ from the policy whose log-probs we score (spec §11.11),
and the log-probs must be scored at the same temperature (spec §11.13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from scratchlm.align.logprobs import completion_logprobs, model_device
from scratchlm.align.rewards import get_reward
from scratchlm.data.align_data import RLPrompt, encode_prompt, end_token
from scratchlm.generate.engine import generate
from scratchlm.model import TransformerLM
from scratchlm.train.precision import full_precision


@dataclass
class Rollout:
    """N = groups * G completions; group k is rows k*G .. k*G + G - 1."""

    prompts: list[list[int]]  # (N,) prompt ids per row
    completions: list[list[int]]  # (N,) completion ids, end token included when generated
    texts: list[str]
    rewards: torch.Tensor  # (N,) task reward
    truncated: torch.Tensor  # (N,) bool, no end token
    lengths: torch.Tensor  # (N,) completion tokens
    example_ids: list[int]  # (N,) index of the source prompt

    def select_groups(self, keep: torch.Tensor, group_size: int) -> "Rollout":
        """Only the groups with keep[k] True (keep: (N/G,) bool)."""
        rows = [r for r in range(len(self.prompts)) if bool(keep[r // group_size])]
        idx = torch.tensor(rows, dtype=torch.long)
        return Rollout([self.prompts[r] for r in rows], [self.completions[r] for r in rows],
                       [self.texts[r] for r in rows], self.rewards[idx], self.truncated[idx], self.lengths[idx],
                       [self.example_ids[r] for r in rows])

    @staticmethod
    def concat(parts: list["Rollout"]) -> "Rollout":
        return Rollout(
            [p for r in parts for p in r.prompts], [c for r in parts for c in r.completions],
            [t for r in parts for t in r.texts], torch.cat([r.rewards for r in parts]),
            torch.cat([r.truncated for r in parts]), torch.cat([r.lengths for r in parts]),
            [e for r in parts for e in r.example_ids])


def sample_rollouts(
    model: TransformerLM, tok: Any, examples: list[RLPrompt], example_ids: list[int], group_size: int,
    max_new_tokens: int, temperature: float = 1.0, seed: int | None = None, **sampling: Any,
) -> Rollout:
    """Generate group_size completions for each examples[i] (i in example_ids) and score them."""
    if not temperature > 0:
        raise ValueError(f"RL rollouts need temperature > 0 (got {temperature}): greedy samples have no log-prob "
                         "ratio and every completion of a group would be identical")
    prompts, ends, rows = [], [], []
    for i in example_ids:
        ex = examples[i]
        ids = ex.ids if ex.ids is not None else encode_prompt(tok, ex.prompt)
        end = ex.end_id if ex.end_id is not None else end_token(tok, ex.prompt)
        prompts += [ids] * group_size
        ends += [end] * group_size
        rows += [i] * group_size
    stops = sorted(set(ends))
    was_training = model.training
    model.eval()
    with full_precision(model_device(model)):  # sampling runs the weights as stored, also in a bf16-mixed step
        outs = generate(model, prompts, max_new_tokens, stop_token_ids=stops, seed=seed,
                        temperature=temperature, **sampling)
    model.train(was_training)
    texts, rewards, truncated = [], [], []
    for out, end, i in zip(outs, ends, rows):
        done = bool(out) and out[-1] == end
        body = out[:-1] if done else out
        text = tok.decode(body)
        texts.append(text)
        truncated.append(not done)
        rewards.append(get_reward(examples[i].reward)(text, examples[i].fields))
    return Rollout(prompts, outs, texts, torch.tensor(rewards, dtype=torch.float32), torch.tensor(truncated),
                   torch.tensor([len(o) for o in outs]), rows)


def per_token_over_rows(fn: Callable[[list[list[int]], list[list[int]]], torch.Tensor], rollout: Rollout,
                        micro_batch: int | None = None) -> torch.Tensor:
    """fn(prompts, completions) -> (b, l) per-token values, run over micro-batches of rows and stitched
    into one detached CPU tensor (N, L) with L = the longest completion (0-padded)."""
    n = len(rollout.prompts)
    step = micro_batch or n
    width = max(1, max(len(c) for c in rollout.completions))
    out = torch.zeros(n, width)
    for s in range(0, n, step):
        part = fn(rollout.prompts[s:s + step], rollout.completions[s:s + step]).detach()
        out[s:s + step, : part.shape[1]] = part.float().cpu()
    return out


@torch.no_grad()
def score_rollout(model: TransformerLM, rollout: Rollout, temperature: float,
                  micro_batch: int | None = None) -> torch.Tensor:
    """Detached per-token log-probs (N, L) of the rollout's completions under `model` at `temperature`."""
    return per_token_over_rows(lambda p, c: completion_logprobs(model, p, c, temperature)[0], rollout, micro_batch)
