"""Language-model losses from logits, written out with a stable log-sum-exp.

Shapes: logits (..., V), targets (...) integer class ids; N = number of positions.

    lse_i    = m_i + log sum_v exp(x_iv - m_i),      m_i = max_v x_iv   (no overflow for large logits)
    nll_i    = lse_i - x_i,y_i                        (= -log softmax(x_i)[y_i])
    smooth_i = lse_i - mean_v x_iv                    (= mean_v -log softmax(x_i)[v])
    loss_i   = (1 - eps) * nll_i + eps * smooth_i + z * lse_i^2
    loss     = sum_{i valid} loss_i / #valid          (valid: y_i != ignore_index)

With eps = z = 0 this is F.cross_entropy; the label-smoothing term matches F.cross_entropy's
`label_smoothing`; the z-loss (PaLM) keeps log Z = lse near 0 so logits do not drift.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOSS_IMPLS = ("reference", "torch")


def _check(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten to logits (N, V) and targets (N,), with a clear error on mismatched shapes."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree: logits must be "
            "targets.shape + (V,)"
        )
    return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)


def _reduce(per_pos: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """mean over valid positions (NaN when none are valid, like torch), sum, or none (0 where ignored)."""
    per_pos = per_pos.masked_fill(~valid, 0.0)
    if reduction == "none":
        return per_pos
    if reduction == "sum":
        return per_pos.sum()
    if reduction == "mean":
        return per_pos.sum() / valid.sum()
    raise ValueError(f"reduction={reduction!r} is not one of ('mean', 'sum', 'none')")


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    reduction: str = "mean",
    impl: str = "reference",
) -> torch.Tensor:
    """Cross entropy of `targets` under softmax(`logits`), computed in fp32 (see module docstring).

    impl="torch" is the fast path (F.cross_entropy + torch.logsumexp for the z-loss); both are tested equal.
    reduction="none" returns the per-position loss with targets' shape (0 at ignored positions).
    """
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if z_loss < 0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss}")
    shape = targets.shape
    x, y = _check(logits, targets)
    x = x.float()  # (N, V)
    valid = y != ignore_index  # (N,)
    if impl == "torch":
        per_pos = F.cross_entropy(x, y, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="none")
        if z_loss:
            per_pos = per_pos + z_loss * torch.logsumexp(x, dim=-1).square()
    elif impl == "reference":
        m = x.amax(dim=-1, keepdim=True).detach()  # (N, 1) the shift; its gradient cancels
        lse = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)  # (N,)
        safe_y = torch.where(valid, y, torch.zeros_like(y))
        nll = lse - x.gather(-1, safe_y[:, None]).squeeze(-1)  # (N,)
        per_pos = nll
        if label_smoothing:
            per_pos = (1.0 - label_smoothing) * nll + label_smoothing * (lse - x.mean(dim=-1))
        if z_loss:
            per_pos = per_pos + z_loss * lse.square()
    else:
        raise ValueError(f"cross entropy impl={impl!r} is not one of {LOSS_IMPLS}")
    out = _reduce(per_pos, valid, reduction)
    return out.reshape(shape) if reduction == "none" else out


def perplexity(mean_loss_nats: float) -> float:
    """exp(mean cross entropy in nats per token); inf when it overflows."""
    try:
        return math.exp(mean_loss_nats)
    except OverflowError:
        return math.inf


def bits_per_byte(mean_loss_nats: float, n_tokens: int, n_bytes: int) -> float:
    """Tokenizer-independent loss: total nats / (n_bytes * ln 2) = loss * n_tokens / n_bytes / ln 2."""
    if n_bytes <= 0 or n_tokens <= 0:
        raise ValueError(f"bits_per_byte needs n_tokens > 0 and n_bytes > 0, got {n_tokens} and {n_bytes}")
    return mean_loss_nats * n_tokens / (n_bytes * math.log(2))
