"""One decode step: tokens (B, 1) at positions (B, 1) -> next-token logits (B, V), cache advanced by 1.

Eager by default (`forward_last`, the model's own forward). `compiled=True` runs the same forward
through torch.compile (inductor, dynamic in the cache length so it compiles once per batch shape,
not per step) with inductor *freezing*: the weights are baked into the compiled graph as constants,
which lets oneDNN pre-pack them (with bf16 weights this uses the CPU's AMX/AVX512-BF16 matmul
kernels), and `cpp_wrapper`: the step's kernel calls are made from generated C++ rather than Python
(A/B on the shared machine: +5-10% tokens per CPU-second at batch 1, within noise at batch 8, +20 s
compile; see benchmarks/RESULTS.md). Because the weights are baked in, changing
them after the first compiled call is refused with a ValueError (use the eager step while training).
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable

import torch

from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache

DecodeStep = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", KVCache], torch.Tensor]


def forward_last(
    model: TransformerLM, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: KVCache
) -> torch.Tensor:
    """model(tokens (B, T), positions (B, T), key mask (B, S) or None, cache) -> last logits (B, V)."""
    return model(tokens, positions, mask, cache, logits_to_keep=1)[:, -1]


@functools.cache
def compiled_forward_last() -> Callable:
    """forward_last through torch.compile (created on first use, shared by all models)."""
    return torch.compile(forward_last, dynamic=True)


@functools.cache
def _frozen_versions() -> weakref.WeakKeyDictionary:
    """model -> parameter version counters at its first compiled step."""
    return weakref.WeakKeyDictionary()


def weight_versions(model: TransformerLM) -> tuple[int, ...]:
    """In-place updates bump a tensor's version counter: a cheap "have the weights changed?" test."""
    return tuple(p._version for p in model.parameters())


def check_frozen_weights(model: TransformerLM) -> None:
    """Record the model's weight versions on first use; raise if they changed since (stale compiled graph)."""
    seen = _frozen_versions()
    now = weight_versions(model)
    if seen.setdefault(model, now) != now:
        raise ValueError(
            "the model's weights changed after its decode step was compiled (weights are frozen into the "
            "compiled graph); use compile_decode=False while training, or build a fresh model object"
        )


def make_decode_step(model: TransformerLM, compiled: bool = False) -> DecodeStep:
    """The step function bound to `model`: eager forward_last, or its frozen torch.compile'd twin."""
    if not compiled:
        return functools.partial(forward_last, model)
    import torch._inductor.config as inductor_config  # heavy: only when compiling

    check_frozen_weights(model)
    fn = compiled_forward_last()

    def step(tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        with inductor_config.patch(freezing=True, cpp_wrapper=True):
            return fn(model, tokens, positions, mask, cache)

    return step
