"""The GRPO family as ONE objective with switches: REINFORCE variants, GRPO, Dr. GRPO, DAPO, GSPO (spec §4-6).

The policy-gradient term (policy_gradient.py, formulas and sources there), chosen by `pg_loss`:
    no_baseline (REINFORCE), reinforce_with_baseline (group mean), grpo (group-normalised, unclipped),
    grpo_clip (clipped surrogate, token or sequence ratio, any eps_low, eps_high >= 0; the default)
plus the KL term and one aggregation (surrogate.aggregate_loss):
    l_{i,t} = pg_{i,t} + beta * KL_{i,t}
    KL_{i,t} = k(logp, ref) (kl.py; k3 = DeepSeekMath Eq. 4), times the importance ratio when
               kl_is_correction: rho_{i,t} at token level, GSPO's sequence ratio s_i at sequence level
               (exactly trl 1.16's `use_bias_correction_kl`, which multiplies by its coef_1)
    loss = seq-mean-token-mean | token-mean | seq-mean-token-sum-norm of l
Unclipped losses (-A log pi) are on-policy estimators: the trainer refuses them with num_iterations > 1.

Metrics: clip fractions are means over tokens at token level and over sequences (those with at least
one token) at sequence level, as trl logs them; the KL metric is its mean over tokens. A batch with no
tokens reports 0.

Our defaults vs trl 1.16's GRPOConfig (preset "trl" reproduces trl's): we default to the DeepSeekMath
paper — seq-mean-token-mean aggregation (trl: loss_type="dapo", a token mean over the generation batch),
beta = 0.04 with the k3 KL (trl: beta = 0.0) and kl_is_correction = False (trl: use_bias_correction_kl =
True). Clip 0.2/0.2, std eps 1e-4, unbiased group std and scale_rewards = "group" are trl's as well.

DAPO extras: dynamic sampling (drop groups whose rewards are all equal, keep sampling; `informative_groups`),
the soft overlong punishment added to the task reward (`soft_overlong_penalty`) and, as the
alternative, overlong filtering (`mask_truncated`: truncated completions are masked out of the loss,
trl's `mask_truncated_completions`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from scratchlm.align.kl import KL_ESTIMATORS, kl_loss_term
from scratchlm.align.logprobs import mask_count, masked_sum
from scratchlm.align.policy_gradient import (IMPORTANCE_LEVELS, PG_LOSS_TYPES, SCALE_REWARDS, compute_advantages,
                                             group_advantages, policy_gradient_loss)
from scratchlm.align.surrogate import LOSS_AGGREGATIONS, aggregate_loss

GRPO_PRESETS = ("grpo", "dr_grpo", "dapo", "gspo", "trl")
__all__ = ["GRPOLossConfig", "GRPO_PRESETS", "IMPORTANCE_LEVELS", "PG_LOSS_TYPES", "SCALE_REWARDS",
           "compute_advantages", "group_advantages", "grpo_loss", "informative_groups", "preset",
           "soft_overlong_penalty"]


@dataclass
class GRPOLossConfig:
    """Switches of the objective. Defaults = DeepSeekMath GRPO (paper aggregation, k3 KL, beta 0.04).

    scale_rewards applies to grpo / grpo_clip only (None = "group"); no_baseline uses the raw reward and
    reinforce_with_baseline the group-centred one, so setting it for those is refused.
    """

    pg_loss: str = "grpo_clip"
    scale_rewards: str | None = None
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
        if self.scale_rewards is not None and self.pg_loss in ("no_baseline", "reinforce_with_baseline"):
            raise ValueError(f"GRPOLossConfig.scale_rewards={self.scale_rewards!r} does not apply to "
                             f"pg_loss={self.pg_loss!r} (its advantage has no std); leave it unset or use grpo")
        for name, value, valid in (("pg_loss", self.pg_loss, PG_LOSS_TYPES),
                                   ("scale_rewards", self.reward_scaling, SCALE_REWARDS),
                                   ("importance_level", self.importance_level, IMPORTANCE_LEVELS),
                                   ("loss_agg", self.loss_agg, LOSS_AGGREGATIONS),
                                   ("kl_estimator", self.kl_estimator, KL_ESTIMATORS)):
            if value not in valid:
                raise ValueError(f"GRPOLossConfig.{name}={value!r} is not one of {valid}")
        if not (self.std_eps >= 0 and self.beta >= 0 and self.overlong_buffer >= 0):
            raise ValueError(f"std_eps, beta and overlong_buffer must be >= 0, got {self.std_eps}, {self.beta}, "
                             f"{self.overlong_buffer}")
        if not (self.clip_low >= 0 and self.eps_high >= 0):
            raise ValueError(f"clip_low and clip_high must be >= 0 (any size, >= 1 included), got {self.clip_low}, "
                             f"{self.clip_high}")
        if self.loss_agg == "seq-mean-token-sum-norm" and not self.max_completion_length:
            raise ValueError("loss_agg='seq-mean-token-sum-norm' (Dr. GRPO) needs max_completion_length")

    @property
    def reward_scaling(self) -> str:
        """The effective scale_rewards ("group" when unset)."""
        return "group" if self.scale_rewards is None else self.scale_rewards

    @property
    def clipped(self) -> bool:
        return self.pg_loss == "grpo_clip"

    @property
    def eps_high(self) -> float:
        return self.clip_low if self.clip_high is None else self.clip_high

    def to_dict(self) -> dict:
        return asdict(self)


def preset(name: str, **overrides) -> GRPOLossConfig:
    """Named settings: grpo (paper), dr_grpo, dapo, gspo, trl (trl 1.16's defaults); overrides are fields."""
    presets: dict[str, dict] = {
        "grpo": {},
        "dr_grpo": dict(scale_rewards="none", loss_agg="seq-mean-token-sum-norm", beta=0.0),
        "dapo": dict(clip_low=0.2, clip_high=0.28, loss_agg="token-mean", beta=0.0, dynamic_sampling=True),
        "gspo": dict(importance_level="sequence", clip_low=3e-4, clip_high=4e-4, beta=0.0),
        "trl": dict(loss_agg="token-mean", beta=0.0, kl_is_correction=True),  # trl 1.16 GRPOConfig()
    }
    if name not in presets:
        raise ValueError(f"unknown GRPO preset {name!r}; valid: {sorted(presets)}")
    return GRPOLossConfig(**{**presets[name], **overrides})


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


def advantages_for(rewards: torch.Tensor, group_size: int, cfg: GRPOLossConfig) -> torch.Tensor:
    """A (N,) for cfg.pg_loss from rewards (N,) (policy_gradient.compute_advantages)."""
    return compute_advantages(rewards, group_size, cfg.pg_loss, cfg.reward_scaling, cfg.std_eps)


def grpo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    cfg: GRPOLossConfig, ref_logp: torch.Tensor | None = None,
    num_tokens: float | None = None, num_seqs: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The family's loss (module docstring). logp/old/ref/mask (B, T), advantages (B,).

    num_tokens / num_seqs: totals over the whole (accumulated) batch for token-mean / the constant
    normaliser (default: this micro-batch).
    """
    per_token, meta = policy_gradient_loss(logp, cfg.pg_loss, advantages, old_logp, mask, cfg.clip_low,
                                           cfg.eps_high, cfg.importance_level)
    kl = None
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError(f"beta={cfg.beta} > 0 needs the reference log-probs ref_logp (or set beta=0)")
        ratio = meta.get("ratio") if cfg.clipped else None
        kl = kl_loss_term(logp, ref_logp, cfg.kl_estimator, old_logp, cfg.kl_is_correction, ratio=ratio)
        per_token = per_token + cfg.beta * kl
    loss = aggregate_loss(per_token, mask, cfg.loss_agg, num_tokens, num_seqs, cfg.max_completion_length)
    return loss, loss_metrics(meta, mask, kl)


@torch.no_grad()
def loss_metrics(meta: dict[str, torch.Tensor], mask: torch.Tensor, kl: torch.Tensor | None) -> dict[str, float]:
    """Clip fractions (over tokens, or over non-empty sequences for a (B, 1) sequence ratio) and mean KL."""

    def frac(flags: torch.Tensor | None) -> float:
        if flags is None:
            return 0.0
        where = mask if flags.shape == mask.shape else (mask_count(mask, 1) > 0).unsqueeze(1)
        n = float(mask_count(where))
        return float(masked_sum(flags.float(), where)) / n if n else 0.0

    n_tok = float(mask_count(mask))
    mean_kl = float(masked_sum(kl, mask)) / n_tok if kl is not None and n_tok else 0.0
    return {"clip_low_frac": frac(meta.get("clip_low")), "clip_high_frac": frac(meta.get("clip_high")),
            "kl": mean_kl}
