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
multiplier, logits scaling, mixture-of-experts FFNs (Mixtral, Qwen3-MoE, Qwen2-MoE's sigmoid-gated shared expert:
the router and each expert's gate|up and down, in ggml blocks or fp32, kernels/csrc/moe_layer.h; the experts read
the model's own weights whatever the decode mode, as the torch step's grouped path does); no learned or sinusoidal positions, fp32
model and cache on CPU, any weight format but "int8" (torch's kernel). Anything else: None, and FastDecoder keeps
its torch path.
"""

from __future__ import annotations

from typing import Any

import torch

from scratchlm.config import ModelConfig
from scratchlm.generate.packed_layer import PackedLayer
from scratchlm.generate.packed_linear import A8_FORMATS, PackedLinear
from scratchlm.kernels import ops
from scratchlm.nn.block_embedding import BlockEmbedding
from scratchlm.nn.block_experts import BlockExperts
from scratchlm.nn.block_linear import BlockLinear
from scratchlm.nn.moe import MOE_ROUTERS, MoE
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


def _moe_fits(layer: PackedLayer) -> bool:
    """An MoE layer the C++ step runs: no residual multiplier, experts (and a shared expert's matrices, without
    biases) in ggml blocks or fp32 on the CPU (make_ffn gives experts and shared expert the config's activation)."""
    moe = layer.moe
    if moe is None:
        return True
    parts = [moe.experts] if moe.shared_expert is None else [moe.experts, moe.shared_expert, moe.shared_expert_gate]
    tensors = [t for m in parts for t in (*m.parameters(), *m.buffers()) if t.dim() >= 2]
    return (layer.m == 1.0 and all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.uint8) for t in tensors)
            and all(getattr(lin, "bias", None) is None for lin in _shared_linears(moe)))


def _shared_linears(moe: MoE) -> list[Any]:
    """The shared expert's gate, up, down and sigmoid-gate modules (Linear or BlockLinear), or []."""
    se = moe.shared_expert
    return [] if se is None else [se.gate_proj, se.up_proj, se.down_proj, moe.shared_expert_gate]


def _module_linear(mod: Any, lins: list[Any]) -> Any:
    """The kernel module's Linear over the model's own Linear / BlockLinear modules stacked by rows (no copy:
    the blocks, or the fp32 weights)."""
    if all(isinstance(lin, BlockLinear) for lin in lins):
        return ops.block_linear(mod, [lin.blocks for lin in lins])
    return _f32_linear(mod, [lin.weight.detach() for lin in lins])


def _f32_linear(mod: Any, ws: list[torch.Tensor]) -> Any:
    """The kernel module's Linear over fp32 matrices ws (rows_i, K) stacked by rows, read in place."""
    return mod.Linear([ops.FORMAT_CODES["F32"]] * len(ws), ws, [w.shape[0] for w in ws], ws[0].shape[1], None, None,
                      None)


def supported(c: ModelConfig, layers: list[PackedLayer], head: PackedLinear, embed: torch.Tensor | BlockEmbedding,
              rope: RotaryEmbedding | None, local_rope: RotaryEmbedding | None = None) -> bool:
    """True when the C++ step computes this function (see the module docstring): RMSNorm, a gated FFN with
    SiLU / GELU / tanh-GELU or experts of one (_moe_fits), static full-width RoPE tables, every matrix in a
    kernel format, CPU memory. The decoder checks the rest itself (fp32, no learned positions, not int8)."""
    linears = [m for layer in layers for m in (layer.qkv, layer.o, layer.ffn_in)] + [head]
    linears += [layer.down for layer in layers if layer.moe is None]
    return (c.norm == "rmsnorm" and _activation(c) is not None and rope is not None
            and _static(rope, c.head_dim) and _static(local_rope, c.head_dim)
            and all(_moe_fits(layer) and (layer.rope_kind != "local" or local_rope is not None) for layer in layers)
            and _table(embed)[0].device.type == "cpu"
            and all(lin is not None and lin.fallback is None for lin in linears))


def _table(embed: torch.Tensor | BlockEmbedding) -> tuple[torch.Tensor, int]:
    """(the embedding table as the kernel reads it, its format code): a BlockEmbedding's own bytes in their
    ggml type (rows widened on lookup), or a dense table as fp32."""
    if isinstance(embed, BlockEmbedding) and embed.ggml_type == "F32":  # an F32 GGUF's table: its bytes as floats
        return embed.data.view(torch.float32), ops.FORMAT_CODES["F32"]
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


def native_moe(mod: Any, layer: PackedLayer, act: int) -> Any:
    """The kernel module's MoELayer of a packed MoE layer: its packed router (the pre-FFN norm's gain folded in,
    as the torch step's), each expert's gate|up and down over the model's own weights (the ggml blocks' slices of
    the stacked expert tensors, or the fp32 matrices), the gain the experts' input carries."""
    moe: MoE = layer.moe
    ex = moe.experts
    if isinstance(ex, BlockExperts):
        for name in ("gate_proj", "up_proj", "down_proj"):  # one copy per expert tensor, sliced per expert
            stacked = ex.stacked(name)
            if stacked is not None:
                ops.repack_stack(mod, stacked, [lin.blocks for lin in getattr(ex, name)])
        gate_up = [ops.block_linear(mod, [ex.gate_proj[e].blocks, ex.up_proj[e].blocks]) for e in range(ex.n_experts)]
        down = [ops.block_linear(mod, [ex.down_proj[e].blocks]) for e in range(ex.n_experts)]
    else:
        g, u, d = (w.detach() for w in (ex.gate_proj, ex.up_proj, ex.down_proj))
        gate_up = [_f32_linear(mod, [g[e], u[e]]) for e in range(g.shape[0])]
        down = [_f32_linear(mod, [d[e]]) for e in range(g.shape[0])]
    gain = torch.empty(0) if layer.ffn_gain is None else layer.ffn_gain
    shared = []
    if moe.shared_expert is not None:
        g, u, d, s = _shared_linears(moe)
        shared = [_module_linear(mod, [g, u]), _module_linear(mod, [d]), _module_linear(mod, [s])]
    return mod.MoELayer(native_linear(mod, layer.ffn_in), gate_up, down, gain, moe.top_k,
                        MOE_ROUTERS.index(moe.router), moe.norm_topk_prob, act, shared)


def native_step(c: ModelConfig, layers: list[PackedLayer], head: PackedLinear, embed: torch.Tensor | BlockEmbedding,
                rope: RotaryEmbedding | None, local_rope: RotaryEmbedding | None = None) -> Any | None:
    """A kernel `LlamaStep` over these packed parts, or None (unsupported architecture or no compiled
    kernels)."""
    mod = ops.native_kernels()
    if mod is None or not supported(c, layers, head, embed, rope, local_rope):
        return None
    try:
        kernel_layers = [[native_linear(mod, lin) for lin in ((l.qkv, l.o) if l.moe is not None else
                                                              (l.qkv, l.o, l.ffn_in, l.down))] for l in layers]
        kernel_head = native_linear(mod, head)
        moe_layers = [native_moe(mod, l, _activation(c)) for l in layers if l.moe is not None]
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
                         c.attn_softcap or 0.0, c.final_softcap or 0.0, c.logits_scaling, moe_layers, _moe_index(layers))


def _moe_index(layers: list[PackedLayer]) -> list[int]:
    """Per layer its index among the MoE layers, or -1 (a dense FFN)."""
    out, n = [], 0
    for layer in layers:
        out.append(n if layer.moe is not None else -1)
        n += layer.moe is not None
    return out
