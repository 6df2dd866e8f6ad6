"""Quantize float weights into ggml blocks for GGUF export: F32, F16, BF16 and Q8_0.

Q8_0 (ggml's `quantize_row_q8_0_ref`), per block of 32 values x_j:
    d = max_j |x_j| / 127,   q_j = roundf(x_j / d) (round half away from zero; q = 0 when d = 0),
    stored as d:f16 followed by q:int8[32]  (34 bytes)
computed in float32 exactly as ggml / gguf-py do (x * (1/d), not x / d), so the bytes are identical to
`gguf.quants.quantize` (tested). Dequantization: quant.ggml_dequant.
"""

from __future__ import annotations

import torch

from scratchlm.quant.ggml_types import ggml_type

Tensor = torch.Tensor


def round_half_away(x: Tensor) -> Tensor:
    """C's roundf: halves go away from zero (torch.round goes to even); exact in float32."""
    a = x.abs()
    floored = a.floor()
    return torch.sign(x) * (floored + (2 * (a - floored)).floor())


def quantize_q8_0(x: Tensor) -> Tensor:
    """(rows, cols) float -> (rows, cols / 32 * 34) uint8 Q8_0 blocks."""
    rows, cols = x.shape
    blocks = x.detach().to(torch.float32).reshape(-1, 32)  # (N, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = round_half_away(blocks * inv).to(torch.int8)
    packed = torch.cat([d.to(torch.float16).view(torch.uint8), q.view(torch.uint8)], dim=1)  # (N, 34)
    return packed.reshape(rows, ggml_type("Q8_0").row_bytes(cols))


def quantize(x: Tensor, type_name: str) -> Tensor:
    """(rows, cols) float -> (rows, row_bytes) uint8 in `type_name` (F32, F16, BF16 or Q8_0)."""
    if x.dim() != 2:
        raise ValueError(f"quantize expects a (rows, cols) matrix, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    t = ggml_type(type_name)
    t.row_bytes(cols)  # a clear error when cols is not a multiple of the block size
    if type_name == "Q8_0":
        return quantize_q8_0(x)
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    if type_name not in dtypes:
        raise ValueError(f"quantizing to {type_name} is not implemented; export supports F32, F16, BF16 and Q8_0")
    return x.detach().to(dtypes[type_name]).contiguous().view(torch.uint8).reshape(rows, t.row_bytes(cols))
