"""Numerically stable softmax and log-softmax over any dim, with an optional boolean mask.

softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j (the shift changes nothing
                   mathematically but keeps exp() from overflowing on large logits)
log_softmax(x)_i = (x_i - m) - log sum_j exp(x_j - m)

Masking: `mask` is boolean, True = keep. Masked entries get probability 0 (log-prob -inf).
A fully masked row (every entry masked, or every logit -inf) is defined as: softmax -> all zeros,
log_softmax -> all -inf. torch.softmax returns NaN there; we never do.
"""

from __future__ import annotations

import torch


def _shifted(x: torch.Tensor, dim: int, mask: torch.Tensor | None) -> torch.Tensor:
    """x - max(x) along `dim`, with masked entries at -inf and fully masked rows shifted by 0."""
    if mask is not None:
        x = x.masked_fill(~mask, float("-inf"))
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    return x - m


def softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Stable softmax along `dim`; fully masked rows give zeros."""
    e = torch.exp(_shifted(x, dim, mask))
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))


def log_softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Stable log-softmax along `dim`; fully masked rows give -inf everywhere."""
    z = _shifted(x, dim, mask)
    s = torch.exp(z).sum(dim=dim, keepdim=True)
    lse = torch.where(s > 0, torch.log(torch.where(s > 0, s, torch.ones_like(s))), torch.full_like(s, float("inf")))
    return z - lse
