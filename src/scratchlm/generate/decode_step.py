"""One decode step: tokens (B, 1) at positions (B, 1) -> next-token logits (B, V), cache advanced by 1.

Modes (DECODE_MODES, the `decode=` argument of the engine):
    "auto"       the fastest exact mode for the model: "fast-gguf" on a GGUF's own blocks, else "fast"
    "model"      the model's own forward (`forward_last`): the reference path
    "fast"       generate.fast_decode.FastDecoder: the same math with re-packed weights and fewer ops
    "fast-int8"  FastDecoder with int8 weight-only matrices (torch's kernel; quantization error)
    "fast-bf16"  FastDecoder, bf16 weights widened exactly to fp32 in our C++ kernel (bf16 rounding error)
    "fast-q8_0"  FastDecoder on ggml Q8_0 blocks (the model's own, or quantized with ggml's rounding)
    "fast-q4_1"  FastDecoder on ggml Q4_1 blocks (likewise)
    "fast-q8_0-a8", "fast-q4_1-a8"  the same blocks, each matrix's input rounded to 8 bits per 32-block
                 first and integer dot products (llama.cpp's CPU scheme; quant/act_quant.py defines it)
    "fast-gguf"  FastDecoder on a GGUF model's own blocks (every ggml type; fp32 where a matrix has none):
                 exactly the loaded model at 2-8 bits per weight (generate/packed_linear.py, kernels/)
    "fast-gguf-a8"  the same blocks times activations rounded to 8 bits (per 32 for the 32-value types,
                 ggml's Q8_K per 256 for the K-quants): llama.cpp's own CPU scheme (quant/act_quant.py)
    "compiled"   the model's forward through torch.compile (below)
Packed decoders are cached per model and rebuilt when its weights change (version counters).

`compiled` runs the same forward
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

from scratchlm.generate.fast_decode import FastDecoder, supports
from scratchlm.model import TransformerLM
from scratchlm.nn.block_linear import BlockLinear
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
            "compiled graph); use decode='model' or 'fast' while training, or build a fresh model object"
        )


FAST_MODES = {"fast": None, "fast-int8": "int8", "fast-bf16": "bf16", "fast-q8_0": "q8_0", "fast-q4_1": "q4_1",
              "fast-gguf": "gguf", "fast-q8_0-a8": "q8_0_a8", "fast-q4_1-a8": "q4_1_a8",
              "fast-gguf-a8": "gguf_a8"}  # mode -> weight format
DECODE_MODES = ("auto", "model", *FAST_MODES, "compiled")


@functools.cache
def _packed_decoders() -> weakref.WeakKeyDictionary:
    """model -> {quant: (weight versions, FastDecoder)}."""
    return weakref.WeakKeyDictionary()


def fast_decoder(model: TransformerLM, quant: str | None = None) -> FastDecoder:
    """The model's FastDecoder for `quant`, packed on first use and re-packed after any weight update."""
    per_model = _packed_decoders().setdefault(model, {})
    versions = weight_versions(model)
    hit = per_model.get(quant)
    if hit is None or hit[0] != versions:
        hit = per_model[quant] = (versions, FastDecoder(model, quant=quant))
    return hit[1]


def on_blocks(model: TransformerLM) -> bool:
    """True when the model's matrices are ggml blocks (a GGUF loaded with dtype=None)."""
    return any(isinstance(m, BlockLinear) for m in model.modules())


def resolve_decode(model: TransformerLM, mode: str) -> str:
    """"auto" -> the fastest exact mode for this model: "fast-gguf" on ggml blocks (the file's own blocks
    through the C++ kernels), else "fast" (packed weights in the model's dtype); other modes unchanged."""
    if mode != "auto":
        return mode
    return "fast-gguf" if on_blocks(model) else "fast"


EXACT_FAST_MODES = ("fast", "fast-gguf")  # the model's own weights (packed, or the file's blocks): same function


def native_decoder(model: TransformerLM, mode: str) -> FastDecoder | None:
    """The FastDecoder of a fast decode `mode` (exact or not) when its whole step runs in C++ (then it also runs
    over block tables: FastDecoder.paged), else None; the same packed object the mode's decode step uses."""
    mode = resolve_decode(model, mode) if mode in DECODE_MODES else mode
    if mode not in FAST_MODES or not supports(model.config):
        return None
    dec = fast_decoder(model, FAST_MODES[mode])
    return dec if dec.native is not None else None


def chunk_decoder(model: TransformerLM, mode: str) -> FastDecoder | None:
    """The FastDecoder of an exact decode `mode`, or of fast-gguf-a8, when its whole step runs in C++ (it then also
    runs a few prompt tokens per call: FastDecoder.chunk), else None; the same packed object the mode's decode
    step uses (no copy). fast-gguf-a8 is llama.cpp's arithmetic for the prompt too (x rounded to 8 bits per block,
    an int8 GEMM: kernels/csrc/a8_gemm.h). The other approximate modes (bf16, int8, the Q8_0 / Q4_1 A8 forms,
    re-quantized blocks) get None: their prompt runs through the model's own weights."""
    mode = resolve_decode(model, mode) if mode in DECODE_MODES else mode
    return native_decoder(model, mode) if mode in (*EXACT_FAST_MODES, "fast-gguf-a8") else None


def make_decode_step(model: TransformerLM, mode: str = "model", batch_size: int | None = None) -> DecodeStep:
    """The step function bound to `model` for a DECODE_MODES mode (ValueError on an unknown one; "auto"
    picks the fastest exact one, see resolve_decode).

    batch_size: the fixed number of rows every step will have (the engine's case), which lets "fast"
    prepare MKL-packed GEMMs for it; None when it varies step to step (the server)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {mode!r}; valid: {DECODE_MODES}")
    mode = resolve_decode(model, mode)
    if mode == "model" or (mode in FAST_MODES and not supports(model.config)):
        return functools.partial(forward_last, model)
    if mode in FAST_MODES:
        dec = fast_decoder(model, FAST_MODES[mode])
        if batch_size is not None:
            dec.pack_for_batch(batch_size)
        return lambda tokens, positions, mask, cache: dec.step(tokens[:, 0], positions[:, 0], mask, cache)
    import torch._inductor.config as inductor_config  # heavy: only when compiling

    check_frozen_weights(model)
    fn = compiled_forward_last()

    def step(tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        with inductor_config.patch(freezing=True, cpp_wrapper=True):
            return fn(model, tokens, positions, mask, cache)

    return step
