"""Soft-capping (Gemma-2): squash values smoothly into (-c, c) instead of clipping them.

    softcap(x, c) = c * tanh(x / c)

Near 0 it is the identity (tanh(u) ~ u), large |x| saturate at +-c, and the gradient never vanishes
abruptly as with a hard clip. Gemma-2 caps the attention logits (after the q.k scaling, before the mask)
with c = 50 and the final LM logits with c = 30; Gemma-3 caps the final logits only.
Shapes: any; elementwise. Computed as (tanh(x / c)) * c, the order transformers uses.
"""

from __future__ import annotations

import torch


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """c * tanh(x / c), elementwise; cap must be > 0."""
    return torch.tanh(x / cap) * cap
