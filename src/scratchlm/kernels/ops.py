"""Python entry points of the decode kernels: y (B, N) = x (B, K) @ W^T with W in a compact format.

`native_kernels()` is the compiled module or None; callers keep a torch fallback for None (same math:
F.linear on the dequantized fp32 matrix). The kernels take contiguous fp32 x and return fp32.
"""

from __future__ import annotations

from types import ModuleType

import torch

from scratchlm.kernels.build import native
from scratchlm.quant.blocks import GGMLBlocks


FORMAT_CODES = {"F32": 0, "BF16": 1, "Q8_0": 2, "Q4_1": 3, "Q8_0_A8": 4, "Q4_1_A8": 5}  # matrix_ref.h's Format


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


def a8_linear(mod: ModuleType, blocks: GGMLBlocks, in_scale: torch.Tensor | None = None,
              out_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> object:
    """The kernels' `Linear` for Q8_0 / Q4_1 blocks in their A8 format (repacked once, see gemv_a8.h):
    `.forward(x)` = (round_act(x * in_scale) @ W^T) * out_scale + bias, quant/act_quant.py's function."""
    if blocks.ggml_type not in ("Q8_0", "Q4_1"):
        raise ValueError(f"no 8-bit-activation kernel for ggml type {blocks.ggml_type!r}; kernels read Q8_0 and Q4_1")
    n, k = blocks.shape
    return mod.Linear(FORMAT_CODES[blocks.ggml_type + "_A8"], blocks.data, n, k, in_scale, out_scale, bias)
