"""FastDecoder's step as one C++ call (kernels/csrc/llama_step.h) for the Llama family on CPU.

At ~150 tokens/s a step has ~6 ms; FastDecoder's Python loop dispatches ~35 torch ops per layer
(~1000 per step for 30 layers, several ms of overhead alone). `native_step(dec)` hands the same packed
matrices (PackedLinear: fp32 / bf16, any ggml block type (a matrix's row parts may differ in type), or the
A8 formats' repacked blocks, with their in/out scales and biases) and the RoPE
tables to `LlamaStep`, which runs [norm] -> qkv -> [QK-norm] -> [RoPE] -> cache write -> GQA attention [softcap]
-> o [output norm] + residual -> [norm] -> gate|up -> act(gate) * up -> down [output norm] + residual per layer
(sliding-window layers read their last W slots), then the head [/ logits scaling, final softcap]. Same math as
FastDecoder.step (tests/kernels/test_native_step.py: equal logits and caches to fp32 rounding).
Supported: RMSNorm in any placement (pre, sandwich, output: Gemma-2/3, OLMo-2), a gated FFN with SiLU, GELU or
tanh-GELU (Llama, Qwen, Mistral: SwiGLU; Gemma: GeGLU), RoPE (half or interleaved; static tables, i.e. every
scaling but dynamic, longrope's two table sets chosen per call as the torch step does, partial rotary; per layer
global, local (Gemma-3's sliding layers) or none (SmolLM3's NoPE)),
QK-norm per head (Qwen3, Gemma-3) or per projection (OLMo-2), attention and final soft-capping, embedding
multiplier, logits scaling; no MoE, no learned or sinusoidal positions, fp32 model and
cache on CPU, any weight format but "int8" (torch's kernel). Anything else: None, and FastDecoder keeps its
torch path.
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


ACT_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}  # llama_step.h's ACT_SILU, ACT_GELU, ACT_GELU_TANH
ROPE_CODES = {"global": 0, "local": 1, None: -1}  # llama_step.h's ROPE_GLOBAL, ROPE_LOCAL, ROPE_NONE


def _activation(c: ModelConfig) -> int | None:
    """The gated FFN's activation code for the C++ step, or None (a plain MLP, or an activation it lacks)."""
    name = "silu" if c.ffn == "swiglu" else c.activation if c.ffn == "glu" else None
    return ACT_CODES.get(name)


def _static(rope: RotaryEmbedding | None, head_dim: int) -> bool:
    """A RoPE whose tables the step can index by position: the first rotary dims of a head (all, or a partial
    rotary's), longrope's two table sets, not dynamic scaling (tables computed per length)."""
    return rope is None or (rope.head_dim <= head_dim and rope.kind != "dynamic")


def supported(c: ModelConfig, layers: list[PackedLayer], head: PackedLinear, embed: torch.Tensor | BlockEmbedding,
              rope: RotaryEmbedding | None, local_rope: RotaryEmbedding | None = None) -> bool:
    """True when the C++ step computes this function (see the module docstring): RMSNorm, a gated FFN with
    SiLU / GELU / tanh-GELU, static full-width RoPE tables, no MoE, every matrix in a kernel format, CPU
    memory. The decoder checks the rest itself (fp32, no learned positions, not int8)."""
    linears = [m for layer in layers for m in (layer.qkv, layer.o, layer.ffn_in, layer.down)] + [head]
    return (c.norm == "rmsnorm" and _activation(c) is not None and rope is not None
            and _static(rope, c.head_dim) and _static(local_rope, c.head_dim)
            and all(layer.moe is None and (layer.rope_kind != "local" or local_rope is not None) for layer in layers)
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
                rope: RotaryEmbedding | None, local_rope: RotaryEmbedding | None = None) -> Any | None:
    """A kernel `LlamaStep` over these packed parts, or None (unsupported architecture or no compiled
    kernels)."""
    mod = ops.native_kernels()
    if mod is None or not supported(c, layers, head, embed, rope, local_rope):
        return None
    try:
        kernel_layers = [[native_linear(mod, lin) for lin in (l.qkv, l.o, l.ffn_in, l.down)] for l in layers]
        kernel_head = native_linear(mod, head)
    except (RuntimeError, ValueError):  # a dimension the kernels do not take (K not a multiple of 16 / 32 / 256)
        return None
    none = torch.empty(0)  # an absent gain or table (LayerSpec casts the present ones to fp32)
    specs = [mod.LayerSpec(-1 if layer.window is None else layer.window, ROPE_CODES[layer.rope_kind], layer.pre_norm,
                           *(none if g is None else g
                             for g in (layer.qk_gain, layer.attn_out_gain, layer.ffn_out_gain))) for layer in layers]
    local = (none, none) if local_rope is None else (local_rope.cos.float(), local_rope.sin.float())
    if rope.kind == "longrope":  # long tables for a call whose positions pass L0 (RotaryEmbedding.tables)
        long = (rope.cos_long.float(), rope.sin_long.float(), int(rope.scaling["original_max_position_embeddings"]))
    else:
        long = (none, none, -1)
    table, fmt = _table(embed)
    return mod.LlamaStep(table, fmt, c.d_model, rope.cos.float(), rope.sin.float(), c.n_heads, c.n_kv_heads,
                         c.head_dim, c.norm_eps, rope.style == "half", kernel_layers, kernel_head, specs,
                         c.qk_norm_scope == "projection", *local, *long, _activation(c), c.embedding_multiplier,
                         c.attn_softcap or 0.0, c.final_softcap or 0.0, c.logits_scaling)
