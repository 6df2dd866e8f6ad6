"""The policy-gradient family as one objective with switches: tensors in, tensors out, for any causal LM.

Advantages from rewards R (N,), laid out as N / G groups of G consecutive completions of one prompt
(`compute_advantages`):
    no_baseline               A_i = R_i                                  REINFORCE (Williams 1992)
    reinforce_with_baseline   A_i = R_i - mean_{j in group(i)} R_j       REINFORCE, group-mean baseline
    grpo, grpo_clip           A_i = (R_i - mean_group R) / (std + eps)   DeepSeekMath (Shao et al. 2024,
                              arXiv 2402.03300) §4.1.2; std within the group ("group"), over the batch
                              ("batch", the mean stays per group) or none ("none" = Dr. GRPO, Liu et al.
                              2025, arXiv 2503.20783). std is unbiased (Bessel), as trl's and verl's.
A group of one has no comparison: its centred advantage is 0. An all-equal group gives A = 0 exactly
(also with eps = 0, where the division would be 0 / 0).

Per-token losses (B, T), with the advantage of sequence i broadcast over its tokens (`policy_gradient_loss`):
    no_baseline, reinforce_with_baseline, grpo:
        l_{i,t} = -A_i log pi_theta(o_{i,t})        on-policy: the gradient is -A grad log pi (the
                                                    REINFORCE estimator); the value is a surrogate
    grpo_clip (PPO's clipped surrogate, Schulman et al. 2017, arXiv 1707.06347; GRPO Eq. 3):
        l_{i,t} = -min(rho A_i, clip(rho, 1 - eps_low, 1 + eps_high) A_i)
        rho_{i,t} = exp(logp_{i,t} - old_{i,t})                       importance_level="token"
        rho_{i,t} = s_i = exp(mean_t (logp_{i,t} - old_{i,t}))        importance_level="sequence" (GSPO,
                    Zheng et al. 2025, arXiv 2507.18071: the length-normalised sequence ratio, as trl
                    computes it; a sequence with no tokens gets s_i = 1, as in trl)
    Any eps_low, eps_high >= 0. eps_low >= 1 puts the lower bound at or below 0, where it can never bind
    since rho > 0 (large and asymmetric ranges, e.g. DeepSeek-R1's eps = 10, are allowed).
    A token (or, at sequence level, a sequence) is clipped when the clipped branch is the active one:
    low side A < 0 and rho < 1 - eps_low, high side A > 0 and rho > 1 + eps_high.

`microbatch_train_step` aggregates a per-token loss (surrogate.aggregate_loss), divides by the number
of gradient-accumulation steps and calls backward(), so k micro-batches give the gradient of one batch.
"""

from __future__ import annotations

import torch

from scratchlm.align.logprobs import mask_count, masked_sum
from scratchlm.align.surrogate import aggregate_loss, clipped_surrogate

PG_LOSS_TYPES = ("no_baseline", "reinforce_with_baseline", "grpo", "grpo_clip")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_LEVELS = ("token", "sequence")


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-4) -> torch.Tensor:
    """Group-centred (and scaled) advantages (N,) from rewards (N,) (module docstring)."""
    n = rewards.numel()
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rewards cannot be split into groups of {group_size}; need N % G == 0")
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r} is not one of {SCALE_REWARDS}")
    if group_size == 1:
        return torch.zeros(n)
    r = rewards.float().reshape(-1, group_size)  # (N/G, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale_rewards != "none":
        scale = r.std(dim=1, keepdim=True) if scale_rewards == "group" else rewards.float().std()
        scale = scale + eps
        # an all-equal group is exactly 0 even with eps = 0 (0 / 0 would be NaN)
        centred = torch.where(centred == 0, torch.zeros_like(centred), centred / scale)
    return centred.reshape(n)


def compute_advantages(rewards: torch.Tensor, group_size: int, loss_type: str = "grpo_clip",
                       scale_rewards: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """A (N,) for `loss_type` (module docstring): raw rewards, group-centred, or group-normalised."""
    if loss_type not in PG_LOSS_TYPES:
        raise ValueError(f"policy-gradient loss_type {loss_type!r} is not one of {PG_LOSS_TYPES}")
    if loss_type == "no_baseline":
        if rewards.numel() % group_size:
            raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}")
        return rewards.float().clone()
    if loss_type == "reinforce_with_baseline":
        return group_advantages(rewards, group_size, "none", eps)
    return group_advantages(rewards, group_size, scale_rewards, eps)


def naive_policy_gradient_loss(advantages: torch.Tensor, policy_log_probs: torch.Tensor) -> torch.Tensor:
    """-A log pi per token: advantages (B,) or (B, 1), policy_log_probs (B, T) -> (B, T)."""
    adv = advantages.detach().to(policy_log_probs.dtype).reshape(-1, 1)  # (B, 1)
    return -adv * policy_log_probs


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """(B, T) token ratios exp(logp - old), or GSPO's sequence ratio s_i as (B, 1) (module docstring)."""
    log_ratio = logp - old_logp.detach()
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        count = mask_count(mask, 1, log_ratio.dtype).clamp(min=1.0)  # an empty sequence: s = exp(0) = 1
        return torch.exp(masked_sum(log_ratio, mask, dim=1) / count).unsqueeze(1)  # (B, 1)
    raise ValueError(f"importance_level {level!r} is not one of {IMPORTANCE_LEVELS}")


def policy_gradient_loss(
    policy_log_probs: torch.Tensor, loss_type: str, advantages: torch.Tensor,
    old_log_probs: torch.Tensor | None = None, response_mask: torch.Tensor | None = None,
    clip_low: float = 0.2, clip_high: float | None = None, importance_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (B, T) of `loss_type` and its metadata (module docstring).

    advantages (B,) come from compute_advantages (raw rewards for no_baseline). grpo_clip needs
    old_log_probs (B, T) (pass policy_log_probs.detach() on-policy) and, at sequence level, response_mask.
    Metadata for grpo_clip: "ratio" ((B, T) or (B, 1)), "clip_low"/"clip_high" (bool, same shape).
    """
    if loss_type not in PG_LOSS_TYPES:
        raise ValueError(f"policy-gradient loss_type {loss_type!r} is not one of {PG_LOSS_TYPES}")
    if loss_type != "grpo_clip":
        return naive_policy_gradient_loss(advantages, policy_log_probs), {}
    if old_log_probs is None:
        raise ValueError("grpo_clip needs old_log_probs (the sampler's log-probs; policy_log_probs.detach() "
                         "on-policy)")
    if importance_level == "sequence" and response_mask is None:
        raise ValueError("the sequence-level (GSPO) ratio needs response_mask")
    mask = torch.ones_like(policy_log_probs) if response_mask is None else response_mask
    ratio = importance_ratio(policy_log_probs, old_log_probs, mask, importance_level)
    adv = advantages.detach().to(ratio.dtype).reshape(-1, 1)  # (B, 1), broadcasts over tokens
    per, low, high = clipped_surrogate(ratio, adv.expand_as(ratio), clip_low,
                                       clip_low if clip_high is None else clip_high)
    return per.expand_as(policy_log_probs), {"ratio": ratio, "clip_low": low, "clip_high": high}


def microbatch_train_step(
    per_token_loss: torch.Tensor, response_mask: torch.Tensor, gradient_accumulation_steps: int = 1,
    loss_agg: str = "seq-mean-token-mean", num_tokens: float | None = None, num_seqs: int | None = None,
    max_length: int | None = None,
) -> torch.Tensor:
    """loss = aggregate(per_token_loss) / gradient_accumulation_steps; calls loss.backward(); returns loss.

    num_tokens / num_seqs: totals over the whole accumulated batch (then pass gradient_accumulation_steps=1:
    the normaliser already spans the batch); by default each micro-batch is normalised on its own and
    the 1 / gradient_accumulation_steps factor averages the micro-batches (trl's "grpo"/"bnpo"/"dr_grpo").
    """
    if gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
    loss = aggregate_loss(per_token_loss, response_mask, loss_agg, num_tokens, num_seqs, max_length)
    loss = loss / gradient_accumulation_steps
    loss.backward()
    return loss.detach()
