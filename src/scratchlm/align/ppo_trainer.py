"""PPO training loop (RLHF-style, with a critic); the score is a named verifiable reward (rewards.py).

One step:
    1. sample one completion per prompt (rollout.py, temperature T); score = reward
       (- missing_eos_penalty when the completion was truncated)
    2. old = log-probs of the sampler, ref = log-probs of the frozen reference, V_old = critic values
    3. r_t = -kl_coef KLest_t + score on the last token (ppo.ppo_rewards); optional reward whitening
       (shift_mean=False); A, R = GAE(gamma, lambda); A whitened over the batch's valid tokens
    4. ppo_epochs passes over micro-batches: L = L_pg(clipped, optional dual clip) + vf_coef L_v(clipped)
       - entropy_coef H, one AdamW step
       per micro-batch (trl's mini-batch updates), on the policy and the critic together.
The critic is a copy of the starting policy with a zero-initialised value head.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from scratchlm.align.run_state import AlignCheckpointer, CheckpointOptions
from scratchlm.align.logprobs import completion_logprobs, model_device, pack_prompt_completion
from scratchlm.align.ppo import (ValueModel, completion_values, gae, ppo_policy_loss, ppo_rewards, ppo_value_loss,
                                 whiten)
from scratchlm.align.rollout import Rollout, per_token_over_rows, sample_rollouts, score_rollout
from scratchlm.align.surrogate import aggregate_loss
from scratchlm.align.trainer_common import IndexBatches, OptimConfig, Stepper, make_reference, run_loop
from scratchlm.data.align_data import RLPrompt
from scratchlm.model import TransformerLM


@dataclass
class PPOTrainConfig:
    """Defaults follow trl's PPOConfig (kl_coef 0.05 k1, clip 0.2/0.2, vf_coef 0.1, gamma 1, lam 0.95, 4 epochs)."""

    steps: int = 50
    prompts_per_step: int = 16
    max_new_tokens: int = 32
    temperature: float = 1.0
    ppo_epochs: int = 4
    micro_batch: int = 16
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    clip_range: float = 0.2
    clip_range_value: float = 0.2
    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 0.95
    whiten_rewards: bool = False
    missing_eos_penalty: float | None = None
    dual_clip: float | None = None  # verl clip_ratio_c (e.g. 3.0); None = off
    entropy_coef: float = 0.0  # entropy bonus: L -= entropy_coef * masked_mean(H)
    seed: int = 0
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "max_new_tokens", "ppo_epochs", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"PPOTrainConfig.{name} must be >= 1, got {getattr(self, name)}")


@torch.no_grad()
def ppo_targets(model, ref, critic, rollout: Rollout, cfg: PPOTrainConfig) -> dict[str, torch.Tensor]:
    """old log-probs, V_old, advantages (whitened) and returns for one rollout, all (N, L) and detached."""
    old = score_rollout(model, rollout, cfg.temperature, cfg.micro_batch)
    ref_lp = score_rollout(ref, rollout, cfg.temperature, cfg.micro_batch)
    mask = per_token_over_rows(lambda p, c: pack_prompt_completion(p, c)[2], rollout)
    values = per_token_over_rows(lambda p, c: completion_values(critic, p, c), rollout, cfg.micro_batch)
    scores = rollout.rewards.clone()
    if cfg.missing_eos_penalty is not None:
        scores = scores - cfg.missing_eos_penalty * rollout.truncated.float()
    rewards, kl = ppo_rewards(scores, old, ref_lp, mask, cfg.kl_coef, cfg.kl_estimator)
    if cfg.whiten_rewards:
        rewards = whiten(rewards, mask, shift_mean=False)
    adv, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
    return {"old": old, "values": values, "adv": whiten(adv, mask), "returns": returns, "mask": mask, "kl": kl}


def ppo_update(model, critic, rollout: Rollout, t: dict[str, torch.Tensor], cfg: PPOTrainConfig,
               stepper: Stepper) -> dict[str, float]:
    """cfg.ppo_epochs passes of clipped policy + value updates, one optimizer step per micro-batch."""
    n, last = len(rollout.prompts), {}
    device = model_device(model)
    for _ in range(cfg.ppo_epochs):
        for s in range(0, n, cfg.micro_batch):
            sl = slice(s, s + cfg.micro_batch)
            prompts, completions = rollout.prompts[sl], rollout.completions[sl]
            logp, mask, ent = completion_logprobs(model, prompts, completions, cfg.temperature, with_entropy=True)
            w = logp.shape[1]
            pick = {k: v[sl, :w].to(device) for k, v in t.items() if k != "kl"}
            pg, m = ppo_policy_loss(logp, pick["old"], pick["adv"], mask, cfg.clip_range,
                                    dual_clip=cfg.dual_clip, agg="token-mean")
            values = completion_values(critic, prompts, completions)
            vl = ppo_value_loss(values, pick["values"], pick["returns"], mask, cfg.clip_range_value)
            entropy = aggregate_loss(ent, mask, "token-mean")
            (pg + cfg.vf_coef * vl - cfg.entropy_coef * entropy).backward()
            last = {"policy_loss": float(pg.detach()), "value_loss": float(vl.detach()), **m,
                    "entropy": float(entropy.detach()), "grad_norm": stepper.step()}
    return last


def train_ppo(model: TransformerLM, tok: Any, examples: list[RLPrompt], cfg: PPOTrainConfig,
              progress: bool = True, on_step: Callable[[dict[str, Any]], None] | None = None,
              checkpoint: CheckpointOptions | None = None) -> tuple[list[dict[str, Any]], ValueModel]:
    """cfg.steps PPO steps in place on `model`; returns per-step metrics and the trained critic.

    checkpoint: every-N-steps checkpoints (policy, reference, critic, optimizer, RNG, data position) and
    resume (align.checkpoint)."""
    torch.manual_seed(cfg.seed)
    ref, ref_part = make_reference(model)
    critic = ValueModel(copy.deepcopy(model)).to(model_device(model))
    updates = cfg.ppo_epochs * -(-cfg.prompts_per_step // cfg.micro_batch)
    stepper = Stepper([model, critic], cfg.optim, cfg.steps * updates)
    batches = IndexBatches(len(examples), cfg.prompts_per_step, cfg.seed)
    ckpt = AlignCheckpointer(checkpoint, model, stepper, {"reference": ref_part, "critic": critic},
                             {"trainer": "ppo", **asdict(cfg)})

    def step_fn(step: int) -> dict[str, Any]:
        rollout = sample_rollouts(model, tok, examples, next(batches), 1, cfg.max_new_tokens, cfg.temperature,
                                  seed=cfg.seed * 1_000_003 + step)
        targets = ppo_targets(model, ref, critic, rollout, cfg)
        return {"step": step, "reward": float(rollout.rewards.mean()),
                "kl": float((targets["kl"] * targets["mask"]).sum(1).mean()),
                **ppo_update(model, critic, rollout, targets, cfg, stepper)}

    history = run_loop("ppo", cfg.steps, ckpt, batches, step_fn, progress, show=("reward",), on_step=on_step)
    return history, critic
