"""Boolean attention masks [firm convention: True = may attend].

Masks broadcast to the attention-score shape (B, H, Tq, Tk).
causal: query at slot i may attend key slot j iff j <= i (slots are absolute cache indices, so a
        chunk of Tq queries starting at slot `start` sees keys 0 .. start + t).
padding: a (B, Tk) key mask, True = real token, False = padding; combined with causal by AND.
"""

from __future__ import annotations

import torch


def causal_mask(t_q: int, t_k: int, start: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """(Tq, Tk) mask with mask[t, j] = j <= start + t (queries occupy slots start .. start+Tq-1)."""
    q_slots = torch.arange(start, start + t_q, device=device)[:, None]  # (Tq, 1)
    k_slots = torch.arange(t_k, device=device)[None, :]  # (1, Tk)
    return k_slots <= q_slots


def padding_to_attention_mask(key_padding: torch.Tensor) -> torch.Tensor:
    """(B, Tk) key mask (True = real token) -> (B, 1, 1, Tk), broadcastable over heads and queries."""
    if key_padding.dtype != torch.bool:
        key_padding = key_padding != 0
    return key_padding[:, None, None, :]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the given masks (None entries are ignored); None if all are None."""
    out: torch.Tensor | None = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out
