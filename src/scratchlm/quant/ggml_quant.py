"""ggml blocks for the decode kernels: Q8_0 and Q4_1 quantization of fp32 weights, as `GGMLBlocks`.

A row of K values (K a multiple of 32) becomes K / 32 blocks laid end to end (uint8 bytes):
    Q8_0  [d fp16][q int8 x 32]                34 bytes   quant/ggml_quantize.py (d = max|x| / 127,
                                                          q = roundf(x / d)), w = d * q
    Q4_1  [d fp16][m fp16][16 bytes of nibbles] 20 bytes  m = min x, d = (max x - min x) / 15,
                                                          q = min(15, trunc((x - m) / d + 0.5)),
                                                          w = d * q + m; byte j holds q_j (low nibble)
                                                          and q_{j+16} (high nibble)
q is computed with the fp32 d (1/d taken once, as ggml's quantize_row_*_ref and gguf-py do); d and m
are then stored as fp16. Test: tests/kernels/test_ggml_quant.py (byte-identical to gguf-py's quantize).
`dequantize_blocks` is the exact map back to fp32 (quant/ggml_dequant.py): the values the kernels use.
"""

from __future__ import annotations

import torch

from scratchlm.quant import ggml_quantize
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.ggml_dequant import dequantize
from scratchlm.quant.ggml_quantize import round_half_away  # noqa: F401  (C's roundf, re-exported)

QK = 32


def _blocks(w: torch.Tensor) -> torch.Tensor:
    """w (N, K) -> fp32 (N, K/32, 32); ValueError unless K is a multiple of 32."""
    if w.dim() != 2 or w.shape[1] % QK:
        raise ValueError(f"ggml blocks need a 2-D matrix with columns a multiple of {QK}, got {tuple(w.shape)}")
    return w.detach().float().reshape(w.shape[0], w.shape[1] // QK, QK)


def _fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """fp32 (N, nb, 1) -> its fp16 bits as uint8 (N, nb, 2), little-endian."""
    return v.to(torch.float16).contiguous().view(torch.uint8)


def quantize_q8_0(w: torch.Tensor) -> GGMLBlocks:
    """fp32 (N, K) -> Q8_0 blocks (see the module docstring)."""
    _blocks(w)
    return GGMLBlocks("Q8_0", ggml_quantize.quantize_q8_0(w).contiguous(), (w.shape[0], w.shape[1]))


def quantize_q4_1(w: torch.Tensor) -> GGMLBlocks:
    """fp32 (N, K) -> Q4_1 blocks (see the module docstring)."""
    x = _blocks(w)
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / torch.where(d == 0, torch.ones_like(d), d))
    q = torch.trunc((x - lo) * inv + 0.5).clamp(0, 15).to(torch.uint8)  # (N, nb, 32)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    data = torch.cat((_fp16_bytes(d), _fp16_bytes(lo), nibbles), dim=-1).reshape(w.shape[0], -1)
    return GGMLBlocks("Q4_1", data.contiguous(), (w.shape[0], w.shape[1]))


def dequantize_blocks(b: GGMLBlocks) -> torch.Tensor:
    """Blocks -> the fp32 (N, K) matrix they encode (Q8_0: d * q; Q4_1: fl(d * q + m), one rounding)."""
    if b.ggml_type not in ("Q8_0", "Q4_1"):
        raise ValueError(f"the decode kernels read Q8_0 and Q4_1 blocks, got {b.ggml_type!r}")
    return dequantize(b.data, b.ggml_type, b.shape)
