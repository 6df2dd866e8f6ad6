"""The clipped policy-gradient surrogate and loss aggregation, shared by PPO and the GRPO family.

Clipped surrogate per token (PPO, Schulman 2017), with rho = exp(logp - old) and advantage A:
    l = max( -A rho , -A clip(rho, 1 - eps_low, 1 + eps_high) )      (= -min(rho A, clip(rho) A))
    dual clip (Ye et al. 2020; verl clip_ratio_c = c > 1): for A < 0, l = min(l, -A c)
eps_low = eps_high is PPO/GRPO; eps_high > eps_low is DAPO's clip-higher. Any eps >= 0 is valid:
eps_low >= 1 moves the lower bound to <= 0, where it never binds (rho > 0).
A token is "clipped" when the clipped branch is the active one and carries no gradient:
    low side:  A < 0 and rho < 1 - eps_low;     high side: A > 0 and rho > 1 + eps_high.

Aggregation of a per-token loss l (B, T) with token mask M (spec §4; the main source of silent
disagreement between implementations):
    "seq-mean-token-mean" (DeepSeekMath Eq. 3):  (1/B) sum_i [ sum_t M l / sum_t M ]
    "token-mean" (DAPO, trl "dapo"/"bnpo", verl):  sum_{i,t} M l / N_tok,  N_tok = num_tokens or sum M
    "seq-mean-token-sum-norm" (Dr. GRPO constant):  sum_{i,t} M l / (B * L_max)
N_tok can be passed in so that it counts every active token of the whole (accumulated) batch; B and
L_max likewise (`num_seqs`, `max_length`), so micro-batches sum to the full-batch loss.
Empty slices, handled explicitly (never a NaN from masked_mean's 0/0): a sequence with no tokens adds 0
to "seq-mean-token-mean" and still counts in B (DeepSeekMath's 1/G; trl's "grpo"); a batch with no
tokens at all gives loss 0 (connected to the graph, so backward() gives zero gradients) in every mode.
"""

from __future__ import annotations

import torch

from scratchlm.align.logprobs import mask_count, masked_sum

LOSS_AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element clipped loss and the low-/high-side clip indicators (module docstring)."""
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"clip range needs eps_low >= 0 and eps_high >= 0, got {eps_low}, {eps_high}")
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        if not dual_clip > 1:
            raise ValueError(f"dual_clip c must be > 1, got {dual_clip}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    r = ratio.detach()
    low = (advantages < 0) & (r < 1.0 - eps_low)
    high = (advantages > 0) & (r > 1.0 + eps_high)
    return loss, low, high


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "seq-mean-token-mean",
    num_tokens: float | None = None,
    num_seqs: int | None = None,
    max_length: int | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar as `mode` says (module docstring)."""
    if mode == "seq-mean-token-mean":
        count = mask_count(mask, 1, per_token.dtype)  # (B,)
        per_seq = masked_sum(per_token, mask, dim=1) / count.clamp(min=1.0)  # empty rows: 0 / 1 = 0
        return per_seq.sum() / (num_seqs or per_token.shape[0])
    if mode == "token-mean":
        n = float(mask_count(mask)) if num_tokens is None else float(num_tokens)
        total = masked_sum(per_token, mask)
        return total if n == 0 else total / n  # no tokens: the (zero) sum itself
    if mode == "seq-mean-token-sum-norm":
        if max_length is None:
            raise ValueError("loss aggregation 'seq-mean-token-sum-norm' needs max_length (the completion cap L_max)")
        return masked_sum(per_token, mask) / ((num_seqs or per_token.shape[0]) * max_length)
    raise ValueError(f"loss aggregation {mode!r} is not one of {LOSS_AGGREGATIONS}")
