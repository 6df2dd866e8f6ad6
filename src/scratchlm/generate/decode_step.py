"""One decode step: tokens (B, 1) at positions (B, 1) -> next-token logits (B, V), cache advanced by 1.

Eager by default. `compiled=True` runs the same forward through torch.compile (one graph per step,
dynamic in the cache length so it compiles once, not per step); see benchmarks/RESULTS.md for when
it pays off.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache

DecodeStep = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", KVCache], torch.Tensor]


def forward_last(
    model: TransformerLM, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: KVCache
) -> torch.Tensor:
    """model(tokens (B, 1), positions (B, 1), key mask (B, S) or None, cache) -> logits (B, V)."""
    return model(tokens, positions, mask, cache)[:, -1]


@functools.cache
def compiled_forward_last() -> Callable:
    """forward_last through torch.compile (created on first use, shared by all models)."""
    return torch.compile(forward_last, dynamic=True)


def make_decode_step(model: TransformerLM, compiled: bool = False) -> DecodeStep:
    """The step function bound to `model`: eager forward_last, or its torch.compile'd twin."""
    fn = compiled_forward_last() if compiled else forward_last
    return functools.partial(fn, model)
