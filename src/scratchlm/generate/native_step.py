"""FastDecoder's step as one C++ call (kernels/csrc/llama_step.h) for the Llama family on CPU.

At ~150 tokens/s a step has ~6 ms; FastDecoder's Python loop dispatches ~35 torch ops per layer
(~1000 per step for 30 layers, several ms of overhead alone). `native_step(dec)` hands the same packed
matrices (PackedLinear: fp32 / bf16 / Q8_0 / Q4_1, or the A8 formats' repacked blocks, with their in/out scales
and biases) and the RoPE
tables to `LlamaStep`, which runs norm -> qkv -> RoPE -> cache write -> GQA attention -> o + residual
-> norm -> gate|up -> SiLU * up -> down + residual per layer (sliding-window layers read their last
W slots), then the head. Same math as
FastDecoder.step (tests/kernels/test_native_step.py: equal logits and caches to fp32 rounding).
Supported: pre-norm RMSNorm, SwiGLU (always SiLU), RoPE (half or interleaved; static tables, i.e.
every scaling but longrope/dynamic), no QK-norm, no learned or
sinusoidal positions, fp32 model and cache on CPU, any weight format but "int8" (torch's kernel).
Anything else: None, and FastDecoder keeps its torch path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from scratchlm.generate.packed_linear import A8_FORMATS, PackedLinear
from scratchlm.kernels import ops

if TYPE_CHECKING:
    from scratchlm.generate.fast_decode import FastDecoder

def supported(dec: "FastDecoder") -> bool:
    """True when the C++ step computes this decoder's function (see the module docstring): a plain
    pre-norm Llama block; every other architecture feature keeps FastDecoder's torch step."""
    c = dec.config
    plain_config = (c.norm == "rmsnorm" and c.ffn == "swiglu" and not c.qk_norm and c.norm_placement == "pre"
                    and getattr(c, "embedding_multiplier", 1.0) == 1.0 and getattr(c, "logits_scaling", 1.0) == 1.0
                    and getattr(c, "final_softcap", None) is None)
    plain_layers = all(getattr(layer, "pre_norm", True) and getattr(layer, "attn_out_gain", None) is None
                       and getattr(layer, "ffn_out_gain", None) is None and getattr(layer, "softcap", None) is None
                       and getattr(layer, "rope_kind", "global") == "global"
                       and getattr(layer, "moe", None) is None for layer in dec.layers)
    return (plain_config and plain_layers and dec.rope is not None and getattr(dec, "local_rope", None) is None
            and dec.rope.head_dim == c.head_dim  # no partial rotary
            and getattr(dec.rope, "kind", None) not in ("longrope", "dynamic")  # position-dependent tables
            and dec.positions is None and dec.dtype == torch.float32
            and dec.embed.device.type == "cpu" and dec.quant != "int8"
            and all(lin.fallback is None for lin in dec.linears()))


def native_linear(mod: Any, lin: PackedLinear) -> Any:
    """The kernel module's Linear holding the same matrix, scales and bias as `lin`."""
    if lin.quant in A8_FORMATS:
        return ops.a8_linear(mod, lin.blocks, lin.in_scale, lin.out_scale, lin.bias)
    if lin.blocks is not None:
        fmt, w = lin.blocks.ggml_type, lin.blocks.data
    else:
        fmt, w = ("BF16", lin.w) if lin.quant == "bf16" else ("F32", lin.w.float())
    n, k = lin.blocks.shape if lin.blocks is not None else tuple(lin.w.shape)
    return mod.Linear(ops.FORMAT_CODES[fmt], w, n, k, lin.in_scale, lin.out_scale, lin.bias)


def native_step(dec: "FastDecoder") -> Any | None:
    """A kernel `LlamaStep` for `dec`, or None (unsupported architecture or no compiled kernels)."""
    mod = ops.native_kernels()
    if mod is None or not supported(dec) or dec.embed.device.type != "cpu":  # CPU memory only
        return None
    try:
        layers = [[native_linear(mod, lin) for lin in (l.qkv, l.o, l.ffn_in, l.down)] for l in dec.layers]
        head = native_linear(mod, dec.head)
    except RuntimeError:  # a dimension the kernels do not take (K not a multiple of 16 / 32)
        return None
    c = dec.config
    windows = [-1 if layer.window is None else layer.window for layer in dec.layers]
    return mod.LlamaStep(dec.embed.float(), dec.rope.cos.float(), dec.rope.sin.float(), c.n_heads, c.n_kv_heads,
                         c.head_dim, c.norm_eps, dec.rope.style == "half", layers, head, windows)
