"""`PackedLinear`: y = x @ W^T + b with W stored in a decode-friendly weight format (FastDecoder's matrices).

Weight formats (`quant`, chosen by the decode mode; WEIGHT_FORMATS):
    None    W in the model's dtype. One row: our C++ fp32 GEMV (kernels/, both cores) when built, else
            torch's x @ W^T over a contiguous W^T copy; B > 1: MKL-packed GEMM for the engine's fixed
            batch (`pack_for_batch`) or W @ x^T.
    "int8"  per-row symmetric int8 + torch's `_weight_int8pack_mm` (bf16 activations; approximate).
    "bf16"  W rounded to bf16, x stays fp32: w = bf16 bits << 16 widened exactly in the kernel.
    "q8_0"  ggml Q8_0 blocks (w = d q), "q4_1" ggml Q4_1 blocks (w = d q + m): the model's own GGUF
            blocks when it has them in that type (`model.quantized_weights`), else quantized from the
            fp32 weights with ggml's reference rounding (quant/quantize.py).
    "gguf"  the model's own GGUF blocks, every type quant/dequantize.py reads (F16 .. Q6_K, IQ4_XS),
            exactly the loaded model (the same dequantized weights HF would run), at block size. Stacked
            matrices whose parts differ in type (a Q4_K_M file's Q4_K q, k and Q6_K v) stay in their own
            types, part by part (`parts`); a part without blocks runs its fp32 weight; a matrix none of
            whose parts has blocks is the fp32 decoder's.
    "q8_0_a8", "q4_1_a8"  the q8_0 / q4_1 blocks, and x (after in_scale) rounded to 8 bits per 32-block
            first (quant/act_quant.py: llama.cpp's CPU scheme), then integer block dot products
            (kernels/csrc/gemv_a8.h, AVX512-VNNI where the CPU has it): y = (d q) W^T, not x W^T.
    "gguf_a8"  the "gguf" parts, each block part times x rounded per block of its type (per 32 values, or
            ggml's Q8_K per 256 for the K-quants and IQ4_XS: act_quant.round_act_blocks), integer dot
            products on the blocks in place (kernels/csrc/gemv_a8_blocks.h): llama.cpp's CPU arithmetic for
            every type. Dense parts (F32 / F16 / BF16) stay exact (fp32 x).
The other kernel formats compute in fp32 on exactly the dequantized weights (kernels/csrc/gemv.h, blocks.h).
Block matrices are never rescaled (that would re-round them): a norm gain g folded into "W diag(g)"
for the dense formats is applied to x instead (x g), and an output row scale s to y (y s).
Without the compiled kernels (SCRATCHLM_KERNELS=0, no compiler) the kernel formats run F.linear on
the dequantized fp32 matrix (after act_quant.round_act for the A8 formats): the same function, at fp32 speed.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from scratchlm.kernels import ops
from scratchlm.quant.act_quant import round_act, round_act_blocks
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import KERNEL_TYPES, dequantize_blocks
from scratchlm.quant.ggml_types import ggml_type
from scratchlm.quant.quantize import quantize_blocks

WEIGHT_FORMATS = (None, "int8", "bf16", "q8_0", "q4_1", "gguf", "q8_0_a8", "q4_1_a8", "gguf_a8")
OWN_BLOCK_FORMATS = ("gguf", "gguf_a8")  # the model's own blocks, part by part
A8_FORMATS = {"q8_0_a8": "q8_0", "q4_1_a8": "q4_1"}  # 8-bit activations -> the weight blocks they read
BLOCK_FORMATS = ("q8_0", "q4_1", *OWN_BLOCK_FORMATS, *A8_FORMATS)
QUANTIZERS = {"q8_0": "Q8_0", "q4_1": "Q4_1"}  # weight format -> the ggml block type it quantizes to
BlockSource = Callable[[torch.Tensor], "GGMLBlocks | None"]  # a weight Parameter -> its GGUF blocks


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-row int8: s_o = max_i |W[o, i]| / 127,  q = clamp(round(W / s), -127, 127).

    W ~ q * s (the dequantized matrix); w (out, in) fp32 -> q (out, in) int8, s (out,) fp32.
    """
    s = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.clamp(torch.round(w / s[:, None]), -127, 127).to(torch.int8)
    return q, s


def mkl_packing_available() -> bool:
    """torch built with MKL and its packed-GEMM linear op (x86 CPU builds)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear:
    """y = x @ W^T + b in one of WEIGHT_FORMATS (module docstring); returns the model's dtype.

    w (out, in) is the (folded) dense matrix for the dense formats; for the block formats `parts` hold W
    (row parts stacked top to bottom, each GGMLBlocks in its own type; `blocks` is the one part when there
    is one, else None) and in_scale (in,) / out_scale (out,) the factors applied to x / y around it.
    """

    def __init__(self, w: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype, quant: str | None,
                 blocks: GGMLBlocks | tuple[GGMLBlocks, ...] | None = None, in_scale: torch.Tensor | None = None,
                 out_scale: torch.Tensor | None = None) -> None:
        self.parts: tuple[GGMLBlocks, ...] = (blocks,) if isinstance(blocks, GGMLBlocks) else tuple(blocks or ())
        self.blocks = self.parts[0] if len(self.parts) == 1 else None
        self.dtype, self.quant = dtype, quant
        self.bias = None if bias is None else bias.to(dtype)
        self.in_scale, self.out_scale = in_scale, out_scale
        self.wt: torch.Tensor | None = None
        self.mkl: tuple[int, torch.Tensor] | None = None  # (batch size, MKL-packed W)
        stored = w if w is not None else self.parts[0].data if self.parts else None
        on_cpu = stored is None or stored.device.type == "cpu"  # the C++ kernels read CPU memory only
        self.native = ops.native_kernels() if on_cpu else None
        self.fallback: torch.Tensor | None = None  # dequantized fp32 W when the kernels are missing
        self.a8: object | None = None  # the kernels' Linear holding the repacked A8 blocks (made on first use)
        self.kernel: object | None = None  # the kernels' Linear over the parts (made on first use)
        if quant == "int8":
            self.q, scale = quantize_int8(w.float())
            self.scale = scale.to(torch.bfloat16)
        elif self.parts:
            if self.native is None or not all(ops.fits(p) for p in self.parts):
                self.fallback = self.dequantized_parts()
        elif quant == "bf16":
            self.w = w.to(torch.bfloat16).contiguous()  # (out, in)
            if self.native is None:
                self.fallback = self.w.float()
        else:
            self.w = w.to(dtype).contiguous()  # (out, in)

    def pack_for_batch(self, batch: int) -> None:
        """Keep an MKL-packed copy of W for `batch` rows (replacing one for another size); fp32 only."""
        cpu_fp32 = self.quant is None and self.dtype == torch.float32 and self.w.device.type == "cpu"
        if cpu_fp32 and mkl_packing_available():
            if self.mkl is None or self.mkl[0] != batch:
                self.mkl = (batch, torch.ops.mkl._mkl_reorder_linear_weight(self.w, batch))

    def transposed(self) -> torch.Tensor:
        """W^T (in, out) contiguous, made on first use (the one-row GEMV layout)."""
        if self.wt is None:
            self.wt = self.w.t().contiguous()
        return self.wt

    def native_fp32(self, x: torch.Tensor) -> bool:
        """Use our fp32 GEMV: one fp32 CPU row (torch's is single-threaded at ~half the bandwidth)."""
        return (self.native is not None and self.quant is None and self.dtype == torch.float32 and x.shape[0] == 1
                and self.w.shape[1] % 16 == 0)

    def residual(self, x: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        """x + self(inp): the residual add fused into the GEMV where possible (addmm for one row)."""
        if self.quant is None and self.bias is None and inp.shape[0] == 1 and not self.native_fp32(inp):
            return torch.addmm(x, inp.to(self.dtype), self.transposed())
        return x + self(inp)

    def kernel_call(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel formats: fp32 x (B, in) -> fp32 (B, out), in/out scales applied."""
        x = x.float()
        if self.in_scale is not None:
            x = x * self.in_scale
        x = x.contiguous()
        if self.fallback is not None and self.quant == "gguf_a8":
            y = self.a8_parts_reference(x)
        elif self.fallback is not None:
            y = F.linear(round_act(x) if self.quant in A8_FORMATS else x, self.fallback)
        elif self.quant in A8_FORMATS:
            if self.a8 is None:
                self.a8 = ops.a8_linear(self.native, self.blocks)
            y = self.a8.forward(x)
        elif self.parts:
            if self.kernel is None:
                self.kernel = ops.block_linear(self.native, self.parts, a8=self.quant == "gguf_a8")
            y = self.kernel.forward(x)
        else:
            y = self.native.linear_bf16(x, self.w)
        return y if self.out_scale is None else y * self.out_scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, in) -> (B, out)."""
        if self.quant == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.scale).to(self.dtype)
            return y if self.bias is None else y + self.bias
        if self.quant is not None:
            y = self.kernel_call(x).to(self.dtype)
            return y if self.bias is None else y + self.bias
        x = x.to(self.dtype)
        if self.mkl is not None and self.mkl[0] == x.shape[0]:
            return torch.ops.mkl._mkl_linear(x, self.mkl[1], self.w, self.bias, self.mkl[0])
        if self.native_fp32(x):
            y = self.native.linear_f32(x.contiguous(), self.w)
        elif x.shape[0] == 1:
            y = x @ self.transposed()
        else:
            y = (self.w @ x.t()).t()  # (out, in) @ (in, B) -> (B, out)
        return y if self.bias is None else y + self.bias

    def a8_parts_reference(self, x: torch.Tensor) -> torch.Tensor:
        """gguf_a8 in torch: each part's F.linear on x rounded per block of its type (dense parts: x itself)."""
        ys, row = [], 0
        for p in self.parts:
            w = self.fallback[row:row + p.shape[0]]
            block = ggml_type(p.ggml_type).block_size
            ys.append(F.linear(x if block == 1 else round_act_blocks(x, block), w))
            row += p.shape[0]
        return torch.cat(ys, dim=-1)

    def dequantized_parts(self) -> torch.Tensor:
        """The block parts' fp32 values stacked, W (out, in), no scales."""
        return torch.cat([dequantize_blocks(p) for p in self.parts])

    def dequantized(self) -> torch.Tensor:
        """The dense matrix this computes with, W (out, in) fp32 (q * s for int8; scales folded in).
        (An A8 format applies it to round_act(x * in_scale), so there it is not the whole function.)"""
        if self.quant == "int8":
            return self.q.float() * self.scale.float()[:, None]
        w = self.dequantized_parts() if self.parts else self.w.float()
        if self.in_scale is not None:
            w = w * self.in_scale[None, :]
        return w if self.out_scale is None else w * self.out_scale[:, None]


def own_blocks(lin: torch.nn.Module, source: BlockSource | None) -> GGMLBlocks | None:
    """A linear's own ggml blocks: a block-backed layer's (nn/block_linear.py: its weight is its `blocks`),
    else the model's record of its weight's blocks (`source`: model.quantized_weights), else None."""
    blocks = getattr(lin, "blocks", None)
    if isinstance(blocks, GGMLBlocks):
        return blocks
    return source(lin.weight) if source is not None else None


def own_parts(linears: list[torch.nn.Module], source: BlockSource | None) -> tuple[GGMLBlocks, ...] | None:
    """The "gguf" format's [W_1; W_2; ...]: each linear's own blocks as one part (an F32 part of its weight where
    it has none), never copied: a mapped file's pages stay the only copy, as llama.cpp keeps them (the kernels
    run the parts of one call as one matrix); None when no linear has blocks or one does not fit its type's
    kernel (the caller then keeps the fp32 matrix)."""
    own = [own_blocks(lin, source) for lin in linears]
    if all(b is None for b in own):
        return None
    parts: list[GGMLBlocks] = []
    for b, lin in zip(own, linears):
        if b is None:
            w = lin.weight.detach().float().contiguous()
            b = GGMLBlocks("F32", w.view(torch.uint8), (w.shape[0], w.shape[1]))
        if b.ggml_type not in KERNEL_TYPES or b.shape[1] % ops.k_multiple(b.ggml_type):
            return None
        parts.append(b)
    return tuple(parts)


def stacked_blocks(linears: list[torch.nn.Module], quant: str,
                   source: BlockSource | None) -> GGMLBlocks | tuple[GGMLBlocks, ...] | None:
    """[W_1; W_2; ...] as block matrices (rows are independent, so stacking is exact), or None.

    q8_0/q4_1 (and their A8 formats): one matrix, each part's own blocks of that type, else quantized from
    its fp32 weight. gguf: own_parts (every type, parts kept in their own types).
    """
    if quant in OWN_BLOCK_FORMATS:
        return own_parts(linears, source)
    ggml = QUANTIZERS[A8_FORMATS.get(quant, quant)]
    own = [own_blocks(lin, source) for lin in linears]
    parts = [b if b is not None and b.ggml_type == ggml else quantize_blocks(lin.weight.detach().float(), ggml)
             for b, lin in zip(own, linears)]
    data = torch.cat([b.data for b in parts])
    return GGMLBlocks(parts[0].ggml_type, data.contiguous(), (data.shape[0], parts[0].shape[1]))


def norm_gain(norm: torch.nn.Module) -> torch.Tensor:
    """A norm's multiplier g (dim,) in fp32: its weight, or 1 + weight for a unit-offset RMSNorm (Gemma)."""
    gain = getattr(norm, "gain", None)
    return (gain() if gain is not None else norm.weight).detach().float()


def packed(linears: list[torch.nn.Module], dtype: torch.dtype, quant: str | None,
           norm: torch.nn.Module | None = None, row_scale: torch.Tensor | None = None,
           source: BlockSource | None = None) -> PackedLinear:
    """The linears (same input) stacked into one matrix [W_1; W_2; ...]; when they read norm(x), the
    norm's gain g is folded in (W diag(g), or x g for block formats) and a LayerNorm bias beta becomes
    the extra bias W beta; row_scale (out,) multiplies output rows (and bias) last."""
    def dense() -> torch.Tensor:  # (out, in); only where needed: a block-backed layer dequantizes on access
        return torch.cat([lin.weight.detach().float() for lin in linears])

    b = None if linears[0].bias is None else torch.cat([lin.bias.detach().float() for lin in linears])
    blocks = stacked_blocks(linears, quant, source) if quant in BLOCK_FORMATS else None
    gain = None if norm is None else norm_gain(norm)
    if norm is not None and getattr(norm, "bias", None) is not None:  # (x_hat g + beta) W^T = ... + beta W^T
        extra = dense() @ norm.bias.detach().float()
        b = extra if b is None else b + extra
    if blocks is not None:
        first = blocks if isinstance(blocks, GGMLBlocks) else blocks[0]
        row_scale = None if row_scale is None else row_scale.to(first.data.device)
        b = b if b is None or row_scale is None else b * row_scale
        return PackedLinear(None, b, dtype, quant, blocks, gain, row_scale)
    w = dense()
    if gain is not None:
        w = w * gain[None, :]
    if row_scale is not None:
        row_scale = row_scale.to(w.device)
        w = w * row_scale[:, None]
        b = None if b is None else b * row_scale
    return PackedLinear(w, b, dtype, None if quant in OWN_BLOCK_FORMATS else quant)
