"""A Linear layer whose weight stays in ggml blocks (a GGUF file's own bytes): y = x @ W^T + b.

W (out, in) is GGMLBlocks [firm layout: rows are output features, as Linear.weight]; nothing else of
the matrix is kept. The reference path dequantizes a tile of rows at a time (quant/block_matmul.py:
the same function as F.linear(x, dequantize(W)), with a bounded transient); the fast path, for up to
KERNEL_MAX_ROWS rows of fp32 activations on the CPU (decoding, prompts; DENSE_KERNEL_MAX_ROWS for an F32 /
F16 / BF16 matrix), is the C++ kernels that widen each block exactly to fp32 (kernels/: in registers for a
few rows, into cache-sized slices for a prompt's GEMM; tested equal up to fp32 summation order).
W is data, not a parameter: a model of BlockLinears trains only what is added on top (LoRA adapters,
QLoRA-style); gradients flow to x through the same tiles.
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.kernels import ops
from scratchlm.quant.block_matmul import Widen, block_linear, dequantize_rows
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import KERNEL_TYPES

# rows of x up to which the C++ kernels (the GEMV's passes of 8 rows, from 9 rows block_gemm.h's blocked GEMM on
# slices widened once) beat widening 4 MiB tiles for torch's GEMM: 1.05-2.8x at 16-512 rows, 0.93x at 1024
# (2-core Zen 3, a 1B model's Q4_K / Q6_K matrices; benchmarks/RESULTS.md)
KERNEL_MAX_ROWS = 512
DENSE_TYPES = ("F32", "F16", "BF16")  # stored values, not blocks: the C++ widening reads block types only
DENSE_KERNEL_MAX_ROWS = 24  # a dense matrix's rows go through the GEMV's passes (no GEMM in C++): torch's beyond


class BlockLinear(nn.Module):
    """y = x W^T + b with W (out_features, in_features) in ggml blocks (module docstring)."""

    def __init__(self, blocks: GGMLBlocks, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = blocks.shape
        self.ggml_type = blocks.ggml_type
        self.register_buffer("data", blocks.data, persistent=False)  # uint8 (out, row_bytes): moves with .to()
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def blocks(self) -> GGMLBlocks:
        """W as GGMLBlocks (the buffer, wherever the module was moved)."""
        return GGMLBlocks(self.ggml_type, self.data, (self.out_features, self.in_features))

    @property
    def weight(self) -> torch.Tensor:
        """W dequantized to fp32 (out, in): a fresh tensor, for code that needs the dense matrix once."""
        return dequantize_rows(self.blocks)

    def dense_weights(self) -> dict[str, torch.Tensor]:
        """{"weight": W dequantized}: what a dense Linear holds (nn/block_state.py)."""
        return {"weight": self.weight}

    def _kernel(self, x: torch.Tensor) -> bool:
        rows = x.numel() // max(x.shape[-1], 1)
        limit = DENSE_KERNEL_MAX_ROWS if self.ggml_type in DENSE_TYPES else KERNEL_MAX_ROWS
        return (rows <= limit and x.dtype == torch.float32 and x.device.type == "cpu"
                and self.data.device.type == "cpu" and self.ggml_type in KERNEL_TYPES and not x.requires_grad
                and ops.fits(self.blocks) and ops.native_kernels() is not None)

    def _widen(self) -> Widen | None:
        """The C++ kernels' widening of blocks to fp32 (the same values as quant/dequantize.py, bit for bit,
        several times faster) where they read this type in CPU memory; None: the torch reference."""
        mod = ops.native_kernels()
        if mod is None or self.data.device.type != "cpu" or self.ggml_type in DENSE_TYPES or not ops.fits(self.blocks):
            return None
        return lambda b, out=None: ops.dequantize(mod, b, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernel(x):
            flat = x.reshape(-1, self.in_features).contiguous()  # (rows, in)
            y = ops.linear_blocks(ops.native_kernels(), flat, self.blocks).view(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        return block_linear(x, self.blocks, None if self.bias is None else self.bias.to(x.dtype), self._widen())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.ggml_type}, "
                f"bias={self.bias is not None}")
