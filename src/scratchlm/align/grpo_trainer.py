"""GRPO-family training loop: rollouts -> rewards -> group advantages -> clipped objective (grpo.py).

One step:
    1. take `prompts_per_step` prompts; sample G completions each (rollout.py, temperature T);
       DAPO dynamic sampling: drop groups with all-equal rewards and sample more prompts until the
       batch has prompts_per_step informative groups or max_refill_rounds rounds were drawn
    2. reward = task reward (+ soft overlong punishment when overlong_buffer > 0)
    3. A = advantages for cfg.loss.pg_loss (group-normalised for grpo/grpo_clip); old = log-probs at T of
       the sampler (= the detached current policy)
    4. num_iterations (mu) passes of clipped updates over micro-batches, the aggregation's normaliser
       counting the whole batch (tokens for token-mean, sequences otherwise), one optimizer step per pass.
With mu = 1 the ratio is 1 in value and the loss gradient is -A grad logp (+ the KL term).
Logged "reward" = mean task reward of EVERY completion sampled in the step (before the dynamic-sampling
filter), so settings with and without dynamic sampling are comparable.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from scratchlm.align.grpo import (GRPOLossConfig, advantages_for, grpo_loss, informative_groups,
                                  soft_overlong_penalty)
from scratchlm.align.run_state import AlignCheckpointer, CheckpointOptions
from scratchlm.align.logprobs import completion_logprobs
from scratchlm.align.rollout import Rollout, sample_rollouts, score_rollout
from scratchlm.align.trainer_common import IndexBatches, OptimConfig, Stepper, make_reference, run_loop
from scratchlm.data.align_data import RLPrompt
from scratchlm.model import TransformerLM


@dataclass
class GRPOTrainConfig:
    steps: int = 50
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    num_iterations: int = 1
    micro_batch: int = 64
    max_refill_rounds: int = 8
    seed: int = 0
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "num_iterations", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOTrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2 and self.loss.pg_loss != "no_baseline":
            raise ValueError(f"group_size={self.group_size}: GRPO compares completions within a group, use G >= 2")
        if self.num_iterations > 1 and not self.loss.clipped:
            raise ValueError(f"pg_loss={self.loss.pg_loss!r} (-A log pi) is an on-policy estimator; it cannot reuse a "
                             f"rollout for num_iterations={self.num_iterations} updates: use num_iterations=1 or "
                             "pg_loss='grpo_clip' (importance ratio + clipping)")


def collect_rollout(model: TransformerLM, tok: Any, examples: list[RLPrompt], batches, cfg: GRPOTrainConfig,
                    step: int) -> tuple[Rollout, dict[str, float]]:
    """Sample one step's groups (with DAPO drop-and-refill when cfg.loss.dynamic_sampling)."""
    g, want = cfg.group_size, cfg.prompts_per_step
    parts, kept, drawn, rounds = [], 0, [], 0
    while rounds < (cfg.max_refill_rounds if cfg.loss.dynamic_sampling else 1) and kept < want:
        ids = next(batches)
        ro = sample_rollouts(model, tok, examples, ids, g, cfg.max_new_tokens, cfg.temperature,
                             seed=cfg.seed * 1_000_003 + step * 101 + rounds)
        drawn.append(ro.rewards)
        if cfg.loss.dynamic_sampling:
            ro = ro.select_groups(informative_groups(ro.rewards, g), g)
        parts.append(ro)
        kept += len(ro.prompts) // g
        rounds += 1
    rollout = Rollout.concat(parts)
    if kept > want:
        rollout = rollout.select_groups(torch.arange(kept) < want, g)
    all_rewards = torch.cat(drawn)
    return rollout, {"reward": float(all_rewards.mean()), "groups": kept, "rounds": rounds}


def shaped_rewards(rollout: Rollout, cfg: GRPOTrainConfig) -> torch.Tensor:
    """Task reward plus DAPO's soft overlong punishment (when overlong_buffer > 0)."""
    r = rollout.rewards.clone()
    if cfg.loss.overlong_buffer > 0:
        r = r + soft_overlong_penalty(rollout.lengths, cfg.max_new_tokens, cfg.loss.overlong_buffer,
                                      cfg.loss.overlong_penalty)
    return r


def update_policy(model, ref, rollout: Rollout, adv: torch.Tensor, cfg: GRPOTrainConfig, stepper: Stepper):
    """mu optimizer steps of the clipped objective over the rollout; returns the metrics of the last pass."""
    n, lc = len(rollout.prompts), cfg.loss
    old = score_rollout(model, rollout, cfg.temperature, cfg.micro_batch) if cfg.num_iterations > 1 else None
    ref_lp = score_rollout(ref, rollout, cfg.temperature, cfg.micro_batch) if ref is not None else None
    kept = [len(c) for c, t in zip(rollout.completions, rollout.truncated.tolist()) if not (lc.mask_truncated and t)]
    n_tokens = float(sum(kept))
    metrics: dict[str, float] = {}
    for _ in range(cfg.num_iterations):
        sums = {"loss": 0.0, "clip_low_frac": 0.0, "clip_high_frac": 0.0, "kl": 0.0}
        for s in range(0, n, cfg.micro_batch):
            sl = slice(s, s + cfg.micro_batch)
            logp, mask = completion_logprobs(model, rollout.prompts[sl], rollout.completions[sl], cfg.temperature)
            if lc.mask_truncated:
                mask = mask * (~rollout.truncated[sl]).to(mask)[:, None]
            w = logp.shape[1]
            old_mb = logp.detach() if old is None else old[sl, :w].to(logp.device)
            ref_mb = None if ref_lp is None else ref_lp[sl, :w].to(logp.device)
            loss, m = grpo_loss(logp, old_mb, adv[sl].to(logp.device), mask, lc, ref_mb, n_tokens, n)
            loss.backward()
            share = mask.shape[0] / n
            sums["loss"] += float(loss.detach())
            for k in ("clip_low_frac", "clip_high_frac", "kl"):
                sums[k] += m[k] * share
        sums["grad_norm"] = stepper.step()
        metrics = sums
    return metrics


def grpo_step(model, ref, tok: Any, examples: list[RLPrompt], batches, cfg: GRPOTrainConfig, stepper: Stepper,
              step: int) -> dict[str, Any]:
    """One rollout step (module docstring) -> its metrics record."""
    rollout, info = collect_rollout(model, tok, examples, batches, cfg, step)
    record: dict[str, Any] = {"step": step, **info,
                              "mean_length": float(rollout.lengths.float().mean()) if rollout.prompts else 0.0}
    if rollout.prompts:
        adv = advantages_for(shaped_rewards(rollout, cfg), cfg.group_size, cfg.loss)
        record.update(update_policy(model, ref, rollout, adv, cfg, stepper))
    if not all(math.isfinite(v) for v in record.values() if isinstance(v, float)):
        raise ValueError(f"GRPO step {step} produced non-finite metrics {record}; lower the learning rate")
    return record


def train_grpo(
    model: TransformerLM, tok: Any, examples: list[RLPrompt], cfg: GRPOTrainConfig,
    progress: bool = True, on_step: Callable[[dict[str, Any]], None] | None = None,
    checkpoint: CheckpointOptions | None = None,
) -> list[dict[str, Any]]:
    """Run cfg.steps GRPO-family steps in place on `model`; returns one metrics record per step.

    checkpoint: every-N-steps checkpoints and resume (align.checkpoint); the reference is a frozen copy of
    the starting model (saved with the checkpoint) or, under a LoRA policy, its base model."""
    torch.manual_seed(cfg.seed)
    ref, ref_part = make_reference(model) if cfg.loss.beta > 0 else (None, None)
    stepper = Stepper([model], cfg.optim, cfg.steps * cfg.num_iterations)
    batches = IndexBatches(len(examples), cfg.prompts_per_step, cfg.seed)
    ckpt = AlignCheckpointer(checkpoint, model, stepper, {"reference": ref_part}, {"trainer": "grpo", **asdict(cfg)})
    return run_loop("grpo", cfg.steps, ckpt, batches,
                    lambda step: grpo_step(model, ref, tok, examples, batches, cfg, stepper, step),
                    progress, show=("reward",), on_step=on_step)
