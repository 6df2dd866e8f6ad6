"""ggml's Q8_0 and Q4_1 block formats from fp32 weights, with ggml's reference rounding, in torch.

A row of K values (K a multiple of 32) becomes K / 32 blocks laid end to end (uint8 bytes):
    Q8_0  [d fp16][q int8 x 32]                34 bytes   d = max|x| / 127, q = roundf(x / d)
                                                          (round half away from zero), w = d * q
    Q4_1  [d fp16][m fp16][16 bytes of nibbles] 20 bytes  m = min x, d = (max x - min x) / 15,
                                                          q = min(15, trunc((x - m) / d + 0.5)),
                                                          w = d * q + m; byte j holds q_j (low nibble)
                                                          and q_{j+16} (high nibble)
q is computed with the fp32 d (1/d taken once, as ggml's quantize_row_*_ref and gguf-py do); d and m
are then stored as fp16. Test: tests/kernels/test_ggml_quant.py (byte-identical to gguf-py's quantize).
`dequantize_blocks` is the exact inverse map to fp32 (the values the decode kernels compute with).
"""

from __future__ import annotations

import torch

from scratchlm.quant.blocks import GGMLBlocks

QK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20}


def _blocks(w: torch.Tensor) -> torch.Tensor:
    """w (N, K) -> fp32 (N, K/32, 32); ValueError unless K is a multiple of 32."""
    if w.dim() != 2 or w.shape[1] % QK:
        raise ValueError(f"ggml blocks need a 2-D matrix with columns a multiple of {QK}, got {tuple(w.shape)}")
    return w.detach().float().reshape(w.shape[0], w.shape[1] // QK, QK)


def _fp16_bytes(v: torch.Tensor) -> torch.Tensor:
    """fp32 (N, nb, 1) -> its fp16 bits as uint8 (N, nb, 2), little-endian."""
    return v.to(torch.float16).contiguous().view(torch.uint8)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1/d, and 0 where d == 0 (an all-zero block)."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: nearest integer, halves away from zero (torch.round rounds halves to even).

    |x| = f + r with f = floor(|x|): round up iff 2r >= 1 (exact in fp32, unlike floor(|x| + 0.5),
    which rounds 0.49999997 + 0.5 up to 1)."""
    a = x.abs()
    f = torch.floor(a)
    return torch.sign(x) * (f + torch.floor(2 * (a - f)))


def quantize_q8_0(w: torch.Tensor) -> GGMLBlocks:
    """fp32 (N, K) -> Q8_0 blocks (see the module docstring)."""
    x = _blocks(w)
    d = x.abs().amax(dim=-1, keepdim=True) / 127  # (N, nb, 1)
    q = round_half_away(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    data = torch.cat((_fp16_bytes(d), q), dim=-1).reshape(w.shape[0], -1)
    return GGMLBlocks("Q8_0", data.contiguous(), (w.shape[0], w.shape[1]))


def quantize_q4_1(w: torch.Tensor) -> GGMLBlocks:
    """fp32 (N, K) -> Q4_1 blocks (see the module docstring)."""
    x = _blocks(w)
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 15).to(torch.uint8)  # (N, nb, 32)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    data = torch.cat((_fp16_bytes(d), _fp16_bytes(lo), nibbles), dim=-1).reshape(w.shape[0], -1)
    return GGMLBlocks("Q4_1", data.contiguous(), (w.shape[0], w.shape[1]))


def _fp16_values(raw: torch.Tensor) -> torch.Tensor:
    """uint8 (..., 2) little-endian fp16 bits -> fp32 (..., 1)."""
    return raw.contiguous().view(torch.float16).float()


def dequantize_blocks(b: GGMLBlocks) -> torch.Tensor:
    """Q8_0 / Q4_1 blocks -> the fp32 (N, K) matrix they encode: d * q, or fl(d * q + m) (one rounding)."""
    if b.ggml_type not in BLOCK_BYTES:
        raise ValueError(f"dequantize_blocks handles {sorted(BLOCK_BYTES)}, got {b.ggml_type!r}")
    n, k = b.shape
    raw = b.data.reshape(n, k // QK, BLOCK_BYTES[b.ggml_type])
    d = _fp16_values(raw[..., 0:2])
    if b.ggml_type == "Q8_0":
        return (d * raw[..., 2:].view(torch.int8).float()).reshape(n, k)
    m = _fp16_values(raw[..., 2:4])
    nib = raw[..., 4:]
    q = torch.cat((nib & 0x0F, nib >> 4), dim=-1).float()  # (N, nb, 32)
    return (d * q + m).reshape(n, k)
