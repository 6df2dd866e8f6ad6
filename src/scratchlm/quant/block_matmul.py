"""Matrix products with a matrix kept in ggml blocks: y = x @ W^T (+ b) without ever holding W in fp32.

W (N, K) is GGMLBlocks: N rows of K values, each row its own run of blocks, so any range of rows
dequantizes on its own. The product is computed a tile of TILE_BYTES of fp32 weights at a time:

    y[..., r0:r1] = x @ dequantize(W[r0:r1])^T          for consecutive row tiles [r0, r1)

which is exactly F.linear(x, dequantize(W)) (the same dot products, each in one matmul), with a
transient of one tile instead of the whole fp32 matrix. The backward pass (for LoRA adapters trained
on a frozen quantized base, QLoRA-style) needs only dL/dx = dL/dy @ W, computed the same way, tile by
tile; W itself gets no gradient. Shapes: x (..., K) -> y (..., N).
`widen(blocks, out) -> fp32 (rows, K)` turns a tile's blocks into values: quant/dequantize.py by default; a
caller may pass a faster widening that gives the same values bit for bit (the C++ kernels' `dequantize`,
nn/block_linear.py), which writes them into `out`, one scratch tile per thread reused by every product: a
fresh tensor of tens of MB costs more in page faults than widening into it (64 MB: ~37 ms of first touches
against ~6 ms to write a warm buffer, 2-core VM).
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import dequantize

TILE_BYTES = 4 << 20  # fp32 bytes of one dequantized row tile (4 MiB: measured best of 0.25-16 MiB)
Widen = Callable[[GGMLBlocks, "torch.Tensor | None"], torch.Tensor]  # (blocks, out) -> their fp32 values (rows, K)
_SCRATCH = threading.local()  # .tile: this thread's fp32 scratch for widened tiles


def tile_rows(blocks: GGMLBlocks) -> int:
    """Rows per tile: TILE_BYTES of fp32 weights, at least one row."""
    return max(1, TILE_BYTES // (4 * blocks.shape[1]))


def widen_reference(blocks: GGMLBlocks) -> torch.Tensor:
    """The blocks' values as fp32 (rows, K): quant/dequantize.py."""
    return dequantize(blocks.data, blocks.ggml_type, blocks.shape)


def scratch_tile(rows: int, k: int) -> torch.Tensor:
    """This thread's reusable fp32 CPU scratch viewed as (rows, K); valid until the thread's next call."""
    buf = getattr(_SCRATCH, "tile", None)
    if buf is None or buf.numel() < rows * k:
        buf = _SCRATCH.tile = torch.empty(max(rows * k, TILE_BYTES // 4), dtype=torch.float32)
    return buf[: rows * k].view(rows, k)


def dequantize_rows(blocks: GGMLBlocks, start: int = 0, end: int | None = None,
                    widen: Widen | None = None, scratch: bool = False) -> torch.Tensor:
    """Rows [start, end) of W as fp32 (end - start, K); scratch: widen into this thread's scratch tile (the
    result is overwritten by the next scratch widening: use it at once)."""
    end = blocks.shape[0] if end is None else end
    rows = GGMLBlocks(blocks.ggml_type, blocks.data[start:end], (end - start, blocks.shape[1]))
    if widen is None:
        return widen_reference(rows)
    return widen(rows, scratch_tile(*rows.shape) if scratch and blocks.data.device.type == "cpu" else None)


def matmul_t(x: torch.Tensor, blocks: GGMLBlocks, widen: Widen | None = None) -> torch.Tensor:
    """x (..., K) @ W^T -> (..., N) in x's dtype, W dequantized one row tile at a time."""
    n, k = blocks.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the block matrix takes K = {k}")
    rows = tile_rows(blocks)
    if rows >= n:
        return x @ dequantize_rows(blocks, widen=widen, scratch=True).to(x.dtype).t()
    out = x.new_empty(*x.shape[:-1], n)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        out[..., r0:r1] = x @ dequantize_rows(blocks, r0, r1, widen, scratch=True).to(x.dtype).t()  # (..., r1 - r0)
    return out


def matmul(g: torch.Tensor, blocks: GGMLBlocks, widen: Widen | None = None) -> torch.Tensor:
    """g (..., N) @ W -> (..., K) in g's dtype (the input gradient of y = x W^T), tile by tile."""
    n, k = blocks.shape
    rows = tile_rows(blocks)
    if rows >= n:
        return g @ dequantize_rows(blocks, widen=widen, scratch=True).to(g.dtype)
    out = None
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        part = g[..., r0:r1] @ dequantize_rows(blocks, r0, r1, widen, scratch=True).to(g.dtype)  # (..., K)
        out = part if out is None else out.add_(part)
    return out


class _BlockLinearFn(torch.autograd.Function):
    """y = x W^T with W in blocks: gradient for x only (W is frozen data, not a parameter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, data: torch.Tensor, blocks: GGMLBlocks, widen: Widen | None) -> torch.Tensor:
        ctx.blocks, ctx.widen = blocks, widen
        return matmul_t(x, blocks, widen)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return matmul(grad, ctx.blocks, ctx.widen), None, None, None


def block_linear(x: torch.Tensor, blocks: GGMLBlocks, bias: torch.Tensor | None = None,
                 widen: Widen | None = None) -> torch.Tensor:
    """x (..., K) @ W^T + b -> (..., N), differentiable in x (and b); see the module docstring."""
    y = _BlockLinearFn.apply(x, blocks.data, blocks, widen) if x.requires_grad else matmul_t(x, blocks, widen)
    return y if bias is None else y + bias
