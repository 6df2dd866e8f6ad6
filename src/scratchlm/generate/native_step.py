"""FastDecoder's step as one C++ call (kernels/csrc/llama_step.h) for the Llama family on CPU.

At ~150 tokens/s a step has ~6 ms; FastDecoder's Python loop dispatches ~35 torch ops per layer
(~1000 per step for 30 layers, several ms of overhead alone). `native_step(dec)` hands the same packed
matrices (PackedLinear: fp32 / bf16, any ggml block type (a matrix's row parts may differ in type), or the
A8 formats' repacked blocks, with their in/out scales and biases) and the RoPE
tables to `LlamaStep`, which runs norm -> qkv -> [QK-norm] -> RoPE -> cache write -> GQA attention -> o + residual
-> norm -> gate|up -> SiLU * up -> down + residual per layer (sliding-window layers read their last
W slots), then the head. Same math as
FastDecoder.step (tests/kernels/test_native_step.py: equal logits and caches to fp32 rounding).
Supported: pre-norm RMSNorm, SwiGLU (always SiLU), RoPE (half or interleaved; static tables, i.e.
every scaling but longrope/dynamic), QK-norm per head (Qwen3) or per projection, no learned or
sinusoidal positions, fp32 model and cache on CPU, any weight format but "int8" (torch's kernel).
Anything else: None, and FastDecoder keeps its torch path.
"""

from __future__ import annotations

from typing import Any

import torch

from scratchlm.config import ModelConfig
from scratchlm.generate.packed_layer import PackedLayer
from scratchlm.generate.packed_linear import A8_FORMATS, PackedLinear
from scratchlm.kernels import ops
from scratchlm.nn.block_embedding import BlockEmbedding
from scratchlm.nn.rope import RotaryEmbedding


def supported(c: ModelConfig, layers: list[PackedLayer], head: PackedLinear, embed: torch.Tensor | BlockEmbedding,
              rope: RotaryEmbedding | None) -> bool:
    """True when the C++ step computes this function (see the module docstring): plain pre-norm Llama
    blocks, static full-width RoPE tables, every matrix in a kernel format, CPU memory. The decoder
    checks the rest itself (fp32, no learned positions, no second RoPE, not int8)."""
    plain_config = (c.norm == "rmsnorm" and c.ffn == "swiglu" and c.norm_placement == "pre"
                    and c.embedding_multiplier == 1.0 and c.logits_scaling == 1.0 and c.final_softcap is None)
    linears = [m for layer in layers for m in (layer.qkv, layer.o, layer.ffn_in, layer.down)] + [head]
    return (plain_config and all(layer.plain_llama() for layer in layers) and rope is not None
            and rope.head_dim == c.head_dim  # no partial rotary
            and rope.kind not in ("longrope", "dynamic")  # position-dependent tables
            and _table(embed)[0].device.type == "cpu"
            and all(lin is not None and lin.fallback is None for lin in linears))


def _table(embed: torch.Tensor | BlockEmbedding) -> tuple[torch.Tensor, int]:
    """(the embedding table as the kernel reads it, its format code): a BlockEmbedding's own bytes in their
    ggml type (rows widened on lookup), or a dense table as fp32."""
    if isinstance(embed, BlockEmbedding):
        return embed.data, ops.FORMAT_CODES[embed.ggml_type]
    return embed.float(), ops.FORMAT_CODES["F32"]


def native_linear(mod: Any, lin: PackedLinear) -> Any:
    """The kernel module's Linear holding the same matrix (all its parts), scales and bias as `lin`."""
    if lin.quant in A8_FORMATS:
        return ops.a8_linear(mod, lin.blocks, lin.in_scale, lin.out_scale, lin.bias)
    if lin.parts:
        return ops.block_linear(mod, lin.parts, lin.in_scale, lin.out_scale, lin.bias, a8=lin.quant == "gguf_a8")
    fmt, w = ("BF16", lin.w) if lin.quant == "bf16" else ("F32", lin.w.float())
    n, k = tuple(lin.w.shape)
    return mod.Linear([ops.FORMAT_CODES[fmt]], [w], [n], k, lin.in_scale, lin.out_scale, lin.bias)


def native_step(c: ModelConfig, layers: list[PackedLayer], head: PackedLinear, embed: torch.Tensor | BlockEmbedding,
                rope: RotaryEmbedding | None) -> Any | None:
    """A kernel `LlamaStep` over these packed parts, or None (unsupported architecture or no compiled
    kernels)."""
    mod = ops.native_kernels()
    if mod is None or not supported(c, layers, head, embed, rope):
        return None
    try:
        kernel_layers = [[native_linear(mod, lin) for lin in (l.qkv, l.o, l.ffn_in, l.down)] for l in layers]
        kernel_head = native_linear(mod, head)
    except (RuntimeError, ValueError):  # a dimension the kernels do not take (K not a multiple of 16 / 32 / 256)
        return None
    windows = [-1 if layer.window is None else layer.window for layer in layers]
    table, fmt = _table(embed)
    qk_gains = [torch.empty(0) if layer.qk_gain is None else layer.qk_gain.float() for layer in layers]
    return mod.LlamaStep(table, fmt, c.d_model, rope.cos.float(), rope.sin.float(), c.n_heads, c.n_kv_heads,
                         c.head_dim, c.norm_eps, rope.style == "half", kernel_layers, kernel_head, windows, qk_gains,
                         c.qk_norm_scope == "projection")
