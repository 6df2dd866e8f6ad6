"""Boolean attention masks [firm convention: True = may attend].

Masks broadcast to the attention-score shape (B, H, Tq, Tk).
causal: query at slot i may attend key slot j iff j <= i (slots are absolute cache indices, so a
        chunk of Tq queries starting at slot `start` sees keys 0 .. start + t).
sliding window W (Mistral, Gemma-2/3 local layers): additionally j > i - W, i.e. the W most recent keys,
        itself included (transformers' convention). Slots of one row are consecutive (left padding only
        puts pads before the row's first token), so slot distance = position distance on real tokens.
padding: a (B, Tk) key mask, True = real token, False = padding; combined with causal by AND.
"""

from __future__ import annotations

import torch


def causal_mask(t_q: int, t_k: int, start: int = 0, device: torch.device | None = None,
                window: int | None = None) -> torch.Tensor:
    """(Tq, Tk) mask with mask[t, j] = j <= start + t (queries occupy slots start .. start+Tq-1), and
    j > start + t - window when a sliding window is given."""
    q_slots = torch.arange(start, start + t_q, device=device)[:, None]  # (Tq, 1)
    k_slots = torch.arange(t_k, device=device)[None, :]  # (1, Tk)
    mask = k_slots <= q_slots
    return mask if window is None else mask & (k_slots > q_slots - window)


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


def layer_mask(t: int, s: int, start: int, key_padding: torch.Tensor | None, window: int | None,
               device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(mask, is_causal) for T queries at slots [start, s) over keys [0, s): what the attention of one layer
    type (full, or a sliding window) needs. (None, True) lets the fast path use its causal kernel; (None,
    False) means every key is visible (one decode step without padding or window)."""
    if window is not None and s <= window:
        window = None  # the window reaches back past slot 0: nothing to cut
    if key_padding is not None and key_padding.device.type == "cpu" and bool(key_padding.all()):
        key_padding = None  # no key is padding (one prompt, or rows of one length): no mask needed (checked on
        #                     the CPU only: on an accelerator the check is a host sync per layer; the mask is exact)
    if key_padding is not None:
        return causal_mask(t, s, start, device, window) & padding_to_attention_mask(key_padding), False
    if window is not None:
        return causal_mask(t, s, start, device, window), False
    # queries are the last T slots (start = s - T), so is_causal (bottom-right) is the whole mask: the fast
    # path then runs its causal kernel, or for a chunk over a cached prefix nn/chunk_attention.py
    return (None, False) if t == 1 and start > 0 else (None, True)
