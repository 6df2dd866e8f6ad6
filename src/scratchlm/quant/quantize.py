"""Quantize float weights into ggml blocks: F32, F16, BF16, Q8_0 and Q4_1, byte-identical to ggml / gguf-py.

A row of K values (K a multiple of 32 for the block types) becomes K / 32 blocks laid end to end:
    Q8_0  [d fp16][q int8 x 32]                 34 bytes  d = max|x| / 127, q = roundf(x * (1/d)), w = d q
    Q4_1  [d fp16][m fp16][16 bytes of nibbles]  20 bytes  m = min x, d = (max x - min x) / 15,
                                                           q = min(15, trunc((x - m) * (1/d) + 0.5)),
                                                           w = d q + m; byte j holds q_j (low nibble)
                                                           and q_{j+16} (high nibble)
q is computed with the fp32 d (1/d taken once, as ggml's quantize_row_*_ref and gguf-py do: x * (1/d),
not x / d); d and m are then stored as fp16. roundf rounds halves away from zero.

    quantize(x, "Q8_0")       (rows, cols) float -> (rows, row_bytes) uint8: what a GGUF file stores (export)
    quantize_blocks(w, "Q4_1") the same bytes as GGMLBlocks, for the decode kernels
Tests: tests/quant/test_quantize.py and tests/quant/test_block_quantize.py (bytes equal gguf-py's
quantize). The exact map back to fp32 is quant/dequantize.py.
"""

from __future__ import annotations

import torch

from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.ggml_types import ggml_type

Tensor = torch.Tensor
QK = 32  # values per Q8_0 / Q4_1 block
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def round_half_away(x: Tensor) -> Tensor:
    """C's roundf: halves go away from zero (torch.round goes to even); exact in float32."""
    a = x.abs()
    floored = a.floor()
    return torch.sign(x) * (floored + (2 * (a - floored)).floor())


def _fp16_bytes(v: Tensor) -> Tensor:
    """fp32 (N, nb, 1) -> its fp16 bits as uint8 (N, nb, 2), little-endian."""
    return v.to(torch.float16).contiguous().view(torch.uint8)


def _q8_0_rows(x: Tensor) -> Tensor:
    """(rows, K/32, 32) fp32 -> Q8_0 bytes (rows, K/32 * 34)."""
    d = x.abs().amax(dim=-1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = round_half_away(x * inv).to(torch.int8)
    return torch.cat((_fp16_bytes(d), q.view(torch.uint8)), dim=-1).reshape(x.shape[0], -1)


def _q4_1_rows(x: Tensor) -> Tensor:
    """(rows, K/32, 32) fp32 -> Q4_1 bytes (rows, K/32 * 20)."""
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / torch.where(d == 0, torch.ones_like(d), d))
    q = torch.trunc((x - lo) * inv + 0.5).clamp(0, 15).to(torch.uint8)  # (N, nb, 32)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    return torch.cat((_fp16_bytes(d), _fp16_bytes(lo), nibbles), dim=-1).reshape(x.shape[0], -1)


BLOCK_QUANTIZERS = {"Q8_0": _q8_0_rows, "Q4_1": _q4_1_rows}
QUANTIZE_TYPES = (*FLOAT_DTYPES, *BLOCK_QUANTIZERS)


def quantize(x: Tensor, type_name: str) -> Tensor:
    """(rows, cols) float -> (rows, row_bytes) uint8 in `type_name` (one of QUANTIZE_TYPES)."""
    if x.dim() != 2:
        raise ValueError(f"quantize expects a (rows, cols) matrix, got shape {tuple(x.shape)}")
    if type_name not in QUANTIZE_TYPES:
        raise ValueError(f"quantizing to {type_name} is not implemented; scratchlm quantizes to "
                         f"{', '.join(QUANTIZE_TYPES)} (other types: llama.cpp's quantizer)")
    rows, cols = x.shape
    t = ggml_type(type_name)
    row_bytes = t.row_bytes(cols)  # a clear error when cols is not a multiple of the block size
    if type_name in FLOAT_DTYPES:
        return x.detach().to(FLOAT_DTYPES[type_name]).contiguous().view(torch.uint8).reshape(rows, row_bytes)
    blocks = x.detach().to(torch.float32).reshape(rows, cols // QK, QK)
    return BLOCK_QUANTIZERS[type_name](blocks).contiguous()


def quantize_blocks(w: Tensor, type_name: str) -> GGMLBlocks:
    """fp32 (N, K) -> its GGMLBlocks in `type_name` (Q8_0 or Q4_1 for the decode kernels)."""
    if w.dim() != 2 or w.shape[1] % QK:
        raise ValueError(f"ggml blocks need a 2-D matrix with columns a multiple of {QK}, got {tuple(w.shape)}")
    return GGMLBlocks(type_name, quantize(w, type_name), (w.shape[0], w.shape[1]))
