"""Python entry points of the decode kernels: y (B, N) = x (B, K) @ W^T with W in a compact format.

`native_kernels()` is the compiled module or None; callers keep a torch fallback for None (same math:
F.linear on the dequantized fp32 matrix). The kernels take contiguous fp32 x and return fp32.
"""

from __future__ import annotations

from types import ModuleType

import torch

from scratchlm.kernels.build import native
from scratchlm.quant.blocks import GGMLBlocks


def native_kernels() -> ModuleType | None:
    """The compiled kernel module (built once per machine and cached), or None."""
    return native()


def linear_blocks(mod: ModuleType, x: torch.Tensor, blocks: GGMLBlocks) -> torch.Tensor:
    """x (B, K) fp32 @ (Q8_0 | Q4_1 blocks of an (N, K) matrix)^T -> (B, N) fp32, w dequantized exactly."""
    n, k = blocks.shape
    if blocks.ggml_type == "Q4_1":
        return mod.linear_q4_1(x, blocks.data, n, k)
    if blocks.ggml_type == "Q8_0":
        return mod.linear_q8_0(x, blocks.data, n, k)
    raise ValueError(f"no decode kernel for ggml type {blocks.ggml_type!r}; kernels read Q8_0 and Q4_1")
