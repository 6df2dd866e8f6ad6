"""The GRPO family as ONE objective with switches: GRPO, Dr. GRPO, DAPO, GSPO (spec §4-6).

Group advantages (outcome supervision), rewards R (N,) in groups of G consecutive completions:
    A_i = (R_i - mean_group R) / (std R + eps)   scale_rewards="group" (std within the group)
                                                  scale_rewards="batch" (std over the whole batch; mean per group)
    A_i = R_i - mean_group R                      scale_rewards="none"  (Dr. GRPO)
std is unbiased (Bessel), as in trl and verl; eps is a parameter (trl 1e-4, verl 1e-6). A group of one
has std undefined: its advantage is 0 (it carries no comparison). All-equal groups give A = 0 exactly.

Importance ratio:
    token level (GRPO/DAPO):   rho_{i,t} = exp(logp_{i,t} - old_{i,t})
    sequence level (GSPO):     s_i = exp( masked_mean_t (logp_{i,t} - old_{i,t}) ), broadcast over tokens
                               (trl's pure sequence form; verl's GSPO-token form has the same value and,
                               under seq-mean-token-mean, the same gradient — tested). Use GSPO's own
                               tiny clip range (3e-4 / 4e-4): GRPO's 0.2 effectively disables clipping.
Per-token loss, then aggregated (surrogate.aggregate_loss):
    l_{i,t} = max(-A_i rho, -A_i clip(rho, 1 - eps_low, 1 + eps_high)) + beta * KL_{i,t}
KL_{i,t} = kl.kl_loss_term(estimator, is_correction): k3 in the loss as DeepSeekMath Eq. 4.

DAPO extras: dynamic sampling (drop groups whose rewards are all equal, keep sampling; `informative_groups`),
the soft overlong punishment added to the task reward (`soft_overlong_penalty`) and, as the
alternative, overlong filtering (`mask_truncated`: truncated completions are masked out of the loss,
trl's `mask_truncated_completions`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from scratchlm.align.kl import KL_ESTIMATORS, kl_loss_term
from scratchlm.align.logprobs import masked_mean
from scratchlm.align.surrogate import LOSS_AGGREGATIONS, aggregate_loss, clipped_surrogate

SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_LEVELS = ("token", "sequence")
GRPO_PRESETS = ("grpo", "dr_grpo", "dapo", "gspo")


@dataclass
class GRPOLossConfig:
    """Switches of the objective. Defaults = DeepSeekMath GRPO (paper aggregation, k3 KL, beta 0.04)."""

    scale_rewards: str = "group"
    std_eps: float = 1e-4
    clip_low: float = 0.2
    clip_high: float | None = None  # None = clip_low (symmetric)
    importance_level: str = "token"
    loss_agg: str = "seq-mean-token-mean"
    max_completion_length: int | None = None  # L_max for "seq-mean-token-sum-norm"
    beta: float = 0.04
    kl_estimator: str = "k3"
    kl_is_correction: bool = False
    dynamic_sampling: bool = False
    overlong_buffer: int = 0  # L_cache of the soft overlong punishment; 0 = off
    overlong_penalty: float = 1.0
    mask_truncated: bool = False  # DAPO overlong filtering: truncated completions get no loss

    def __post_init__(self) -> None:
        for name, value, valid in (("scale_rewards", self.scale_rewards, SCALE_REWARDS),
                                   ("importance_level", self.importance_level, IMPORTANCE_LEVELS),
                                   ("loss_agg", self.loss_agg, LOSS_AGGREGATIONS),
                                   ("kl_estimator", self.kl_estimator, KL_ESTIMATORS)):
            if value not in valid:
                raise ValueError(f"GRPOLossConfig.{name}={value!r} is not one of {valid}")
        if not (self.std_eps >= 0 and self.beta >= 0 and self.overlong_buffer >= 0):
            raise ValueError(f"std_eps, beta and overlong_buffer must be >= 0, got {self.std_eps}, {self.beta}, "
                             f"{self.overlong_buffer}")
        if self.loss_agg == "seq-mean-token-sum-norm" and not self.max_completion_length:
            raise ValueError("loss_agg='seq-mean-token-sum-norm' (Dr. GRPO) needs max_completion_length")

    @property
    def eps_high(self) -> float:
        return self.clip_low if self.clip_high is None else self.clip_high

    def to_dict(self) -> dict:
        return asdict(self)


def preset(name: str, **overrides) -> GRPOLossConfig:
    """Named settings: grpo (paper), dr_grpo, dapo, gspo; overrides are validated fields."""
    presets: dict[str, dict] = {
        "grpo": {},
        "dr_grpo": dict(scale_rewards="none", loss_agg="seq-mean-token-sum-norm", beta=0.0),
        "dapo": dict(clip_low=0.2, clip_high=0.28, loss_agg="token-mean", beta=0.0, dynamic_sampling=True),
        "gspo": dict(importance_level="sequence", clip_low=3e-4, clip_high=4e-4, beta=0.0),
    }
    if name not in presets:
        raise ValueError(f"unknown GRPO preset {name!r}; valid: {sorted(presets)}")
    return GRPOLossConfig(**{**presets[name], **overrides})


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-4) -> torch.Tensor:
    """A (N,) from rewards (N,) laid out as N / G groups of G consecutive completions (module docstring)."""
    n = rewards.numel()
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards cannot be split into groups of {group_size}; need N % G == 0")
    r = rewards.float().reshape(-1, group_size)  # (N/G, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if group_size == 1:
        return torch.zeros(n)
    if scale_rewards == "group":
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    elif scale_rewards == "batch":
        centred = centred / (rewards.float().std() + eps)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards={scale_rewards!r} is not one of {SCALE_REWARDS}")
    return centred.reshape(n)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic-sampling filter: (N/G,) bool, True for groups whose rewards are not all equal."""
    r = rewards.reshape(-1, group_size)
    return (r != r[:, :1]).any(dim=1)


def soft_overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (added to the task reward), lengths (N,) -> (N,):
    0 if |y| <= L_max - L_cache;  ((L_max - L_cache) - |y|) / L_cache * factor up to L_max;  -factor beyond."""
    if not 0 < buffer <= max_length:
        raise ValueError(f"overlong buffer L_cache={buffer} must be in (0, L_max={max_length}]")
    expected = max_length - buffer
    pen = (expected - lengths.float()) / buffer * factor
    return pen.clamp(min=-factor, max=0.0)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """(B, T) token ratios, or the GSPO sequence ratio s_i broadcast to (B, T)."""
    log_ratio = logp - old_logp.detach()
    if level == "sequence":
        log_ratio = masked_mean(log_ratio, mask, dim=1).unsqueeze(1).expand_as(logp)
    return torch.exp(log_ratio)


def grpo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    cfg: GRPOLossConfig, ref_logp: torch.Tensor | None = None,
    num_tokens: float | None = None, num_seqs: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The family's loss (module docstring). logp/old/ref/mask (B, T), advantages (B,).

    num_tokens / num_seqs: totals over the whole (accumulated) batch for token-mean / the constant
    normaliser (default: this micro-batch).
    """
    ratio = importance_ratio(logp, old_logp, mask, cfg.importance_level)
    adv = advantages.detach().float().unsqueeze(1).expand_as(logp)  # (B, T)
    per_token, low, high = clipped_surrogate(ratio, adv, cfg.clip_low, cfg.eps_high)
    kl = None
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError(f"beta={cfg.beta} > 0 needs the reference log-probs ref_logp (or set beta=0)")
        kl = kl_loss_term(logp, ref_logp, cfg.kl_estimator, old_logp, cfg.kl_is_correction)
        per_token = per_token + cfg.beta * kl
    loss = aggregate_loss(per_token, mask, cfg.loss_agg, num_tokens, num_seqs, cfg.max_completion_length)
    with torch.no_grad():
        metrics = {"clip_low_frac": float(masked_mean(low.float(), mask)),
                   "clip_high_frac": float(masked_mean(high.float(), mask)),
                   "kl": float(masked_mean(kl, mask)) if kl is not None else 0.0}
    return loss, metrics
