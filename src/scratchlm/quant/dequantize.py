"""Dequantize ggml blocks (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_XS) into float32 tensors.

Every function takes the blocks as a uint8 tensor (N, type_size) and returns the values (N, block_size),
computed in float32 in the same order of operations as ggml's reference `dequantize_row_*`, so the
result is bit-identical to ggml / gguf-py (tested against `gguf.quants.dequantize` and ggml's C). Every product
below is exact in float32 (an f16 d or dmin has 11 significant bits, the scales and q at most 13 together), so
the only rounding is the final + m / - dmin m of the affine types (an FMA gives the same result). Formulas:

    Q8_0   x_j = d q_j                       q_j int8
    Q4_0   x_j = d (q_j - 8)                 q_j = low nibble of qs[j] (j < 16), high nibble of qs[j-16]
    Q4_1   x_j = d q_j + m
    Q5_0   x_j = d (q_j - 16)                q_j = its Q4_0 nibble | (bit j of qh) << 4
    Q5_1   x_j = d q_j + m                   q_j as Q5_0
    IQ4_NL x_j = d kvalues[q_j]              q_j the 4-bit index (nibbles as Q4_0), kvalues = KVALUES_IQ4NL
    Q2_K   x = (d sc_s) q - (dmin m_s)       16 sub-blocks s of 16, sc_s = scales[s] & 15, m_s = scales[s] >> 4,
                                             2-bit q
    Q3_K   x = (d (sc_s - 32)) (q - 4 h)     16 sub-blocks of 16, 6-bit sc_s, 2-bit q, h = 1 where the hmask bit
                                             is clear (so q - 4 there, q where it is set)
    Q4_K   x = (d sc_s) q - (dmin m_s)       8 sub-blocks s of 32, 6-bit sc_s, m_s, 4-bit q
    Q5_K   as Q4_K with q = q4 | bit5 << 4   bit5 of sub-block s at bit s of qh[l]
    Q6_K   x = (d sc_s) (q - 32)             16 sub-blocks s of 16, int8 sc_s, q = 4 low bits | 2 high bits << 4
    IQ4_XS x = (d (ls_s - 32)) kvalues[q]    8 sub-blocks s of 32, ls_s = (scales_l[s // 2] >> 4 (s mod 2)) & 15
                                             | ((scales_h >> 2 s) & 3) << 4; q as IQ4_NL in each sub-block
The 2-bit quants (Q2_K, and Q3_K's low bits) pack each half of 128 values into 32 bytes: bits 2j, 2j+1 of
byte l are value l of group j (j = 0..3, 32 values each; group j = sub-blocks 2j, 2j+1 of the half).
Q3_K's hmask[l] holds the third bit of value l of group k (k = 0..7 over both halves) at bit k; its
12 scale bytes b pack 16 six-bit scales: sc_s = (b[s mod 8] >> 4 (s // 8)) & 15
                                              | ((b[8 + s mod 4] >> 2 (s // 4)) & 3) << 4.
Q4_K/Q5_K's 12 scale bytes pack 8 scales and 8 mins of 6 bits: for s < 4, sc_s = b[s] & 63 and
m_s = b[s+4] & 63; for s >= 4, sc_s = (b[s+4] & 15) | (b[s-4] >> 6) << 4 and m_s = (b[s+4] >> 4) | (b[s] >> 6) << 4.
"""

from __future__ import annotations

from typing import Callable

import torch

from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.ggml_types import ggml_type

Tensor = torch.Tensor

# ggml-common.h's kvalues_iq4nl: the 16 non-linear levels IQ4_NL / IQ4_XS indices point at
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _f16(blocks: Tensor, start: int) -> Tensor:
    """The f16 at byte `start` of every block, as float32 (N, 1)."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: Tensor) -> Tensor:
    """(N, n) bytes -> (N, 2 n) 4-bit values: the n low nibbles, then the n high ones."""
    out = torch.empty((qs.shape[0], 2, qs.shape[1]), dtype=torch.uint8, device=qs.device)
    torch.bitwise_and(qs, 0x0F, out=out[:, 0])
    torch.bitwise_right_shift(qs, 4, out=out[:, 1])
    return out.reshape(qs.shape[0], 2 * qs.shape[1])


def _k_scales(packed: Tensor) -> tuple[Tensor, Tensor]:
    """The 12 packed bytes of Q4_K/Q5_K (N, 12) -> 6-bit scales and mins, each (N, 8) as float32."""
    low, mid, top = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low & 63, (top & 0x0F) | ((low >> 6) << 4)], dim=1)
    mins = torch.cat([mid & 63, (top >> 4) | ((mid >> 6) << 4)], dim=1)
    return scales.to(torch.float32), mins.to(torch.float32)


def _q8_0(b: Tensor) -> Tensor:
    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32).mul_(_f16(b, 0))


def _q4_0(b: Tensor) -> Tensor:
    q = _nibbles(b[:, 2:]).to(torch.float32).sub_(8)  # (N, 32); q - 8 is exact in float32
    return q.mul_(_f16(b, 0))


def _q4_1(b: Tensor) -> Tensor:
    q = _nibbles(b[:, 4:]).to(torch.float32)  # (N, 32)
    return q.mul_(_f16(b, 0)).add_(_f16(b, 2))


def _fifth_bits(qh: Tensor) -> Tensor:
    """(N, 4) bytes of a little-endian u32 -> (N, 32) uint8 bits: bit j (value j's fifth bit) at column j."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], 32)  # (N, byte, bit) -> (N, 32)


def _q5_0(b: Tensor) -> Tensor:
    q = (_nibbles(b[:, 6:22]) | (_fifth_bits(b[:, 2:6]) << 4)).to(torch.float32).sub_(16)  # (N, 32), exact
    return q.mul_(_f16(b, 0))


def _q5_1(b: Tensor) -> Tensor:
    q = (_nibbles(b[:, 8:24]) | (_fifth_bits(b[:, 4:8]) << 4)).to(torch.float32)  # (N, 32)
    return q.mul_(_f16(b, 0)).add_(_f16(b, 2))


def _kvalues(q: Tensor) -> Tensor:
    """4-bit indices (any shape, uint8) -> the IQ4_NL levels they name, float32."""
    table = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=q.device)
    return table[q.long()]


def _iq4_nl(b: Tensor) -> Tensor:
    return _kvalues(_nibbles(b[:, 2:18])).mul_(_f16(b, 0))  # (N, 32): kvalues[q] d, one rounding


def _two_bit_groups(qs: Tensor) -> Tensor:
    """Q2_K/Q3_K's qs (N, 64) -> 2-bit q (N, 16, 16) uint8 in value order: (half, group j, byte l) with
    q = (qs[32 half + l] >> 2 j) & 3, so sub-block 8 half + 2 j + l // 16 holds 16 consecutive values."""
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=qs.device).view(1, 1, 4, 1)
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 16, 16)  # (N, half, j, 32) -> (N, 16, 16)


def _q2_k(b: Tensor) -> Tensor:
    sc = b[:, 0:16]  # (N, 16): low nibble the scale, high nibble the min of each sub-block
    dl = (_f16(b, 80) * (sc & 0x0F).to(torch.float32)).unsqueeze(-1)  # (N, 16, 1)
    ml = (_f16(b, 82) * (sc >> 4).to(torch.float32)).unsqueeze(-1)
    q = _two_bit_groups(b[:, 16:80]).to(torch.float32)
    return q.mul_(dl).sub_(ml).reshape(b.shape[0], 256)


def _q3_k_scales(packed: Tensor) -> Tensor:
    """Q3_K's 12 scale bytes (N, 12) -> the 16 signed scales sc_s - 32 (N, 16) as float32."""
    low = torch.cat([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], dim=1)  # (N, 16): the 4 low bits
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=packed.device).view(1, 4, 1)
    high = ((packed[:, 8:12].unsqueeze(1) >> shifts) & 3).reshape(-1, 16)  # (N, shift, 4) -> (N, 16)
    return (low | (high << 4)).to(torch.float32).sub_(32)


def _q3_k(b: Tensor) -> Tensor:
    n = b.shape[0]
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    h = ((b[:, 0:32].unsqueeze(1) >> shifts) & 1).reshape(n, 16, 16)  # (N, group k = 4 half + j, 32) -> (N, 16, 16)
    q = _two_bit_groups(b[:, 32:96]).to(torch.float32).sub_((1 - h).to(torch.float32) * 4)  # q - 4 where h is clear
    dl = (_f16(b, 108) * _q3_k_scales(b[:, 96:108])).unsqueeze(-1)  # (N, 16, 1)
    return q.mul_(dl).reshape(n, 256)


def _iq4_xs(b: Tensor) -> Tensor:
    n = b.shape[0]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4)
    high = ((b[:, 2:4].unsqueeze(-1) >> shifts) & 3).reshape(n, 8)  # scales_h, little endian: (N, byte, 4) -> (N, 8)
    low = torch.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], dim=-1).reshape(n, 8)  # (N, byte, nibble) -> (N, 8)
    dl = (_f16(b, 0) * (low | (high << 4)).to(torch.float32).sub_(32)).unsqueeze(-1)  # (N, 8, 1)
    q = _kvalues(_nibbles(b[:, 8:136].reshape(n * 8, 16))).reshape(n, 8, 32)  # each sub-block's 16 bytes as IQ4_NL
    return q.mul_(dl).reshape(n, 256)


def _k_affine(b: Tensor, q: Tensor) -> Tensor:
    """x = (d sc_s) q - (dmin m_s) over 8 sub-blocks of 32; q is (N, 8, 32) float32."""
    scales, mins = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * scales).unsqueeze(-1)  # (N, 8, 1)
    dm = (_f16(b, 2) * mins).unsqueeze(-1)
    return q.mul_(d).sub_(dm).reshape(b.shape[0], 256)


def _q4_k(b: Tensor) -> Tensor:
    # qs holds 4 chunks of 32 bytes; chunk c's low nibbles are sub-block 2c, its high nibbles 2c + 1
    qs = b[:, 16:144].reshape(b.shape[0] * 4, 32)
    q = _nibbles(qs).reshape(b.shape[0], 8, 32)
    return _k_affine(b, q.to(torch.float32))


def _q5_k(b: Tensor) -> Tensor:
    n = b.shape[0]
    qh = b[:, 16:48]  # (N, 32): bit s of qh[l] is the fifth bit of value l of sub-block s
    low = _nibbles(b[:, 48:176].reshape(n * 4, 32)).reshape(n, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    high = (qh.unsqueeze(1) >> shifts) & 1  # (N, 8, 32)
    return _k_affine(b, (low | (high << 4)).to(torch.float32))


def _q6_k(b: Tensor) -> Tensor:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32)  # (N, half, part, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)  # (N, half, 1, 32)
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)  # (N, 16)
    d = _f16(b, 208)
    # in each half of 128 values, group g (32 values) takes the low (g < 2) or high nibble of ql part g % 2,
    # and bits 2g, 2g+1 of qh
    low = torch.stack([ql & 0x0F, ql >> 4], dim=2).reshape(n, 2, 4, 32)  # (N, half, group, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16).to(torch.float32)  # (N, sub-block, 16)
    return ((d * scales).unsqueeze(-1) * q).reshape(n, 256)


def _f32(b: Tensor) -> Tensor:
    return b.contiguous().view(torch.float32)


def _f16_values(b: Tensor) -> Tensor:
    return b.contiguous().view(torch.float16).to(torch.float32)


def _bf16(b: Tensor) -> Tensor:
    return b.contiguous().view(torch.bfloat16).to(torch.float32)


DEQUANTIZE_BLOCKS: dict[str, Callable[[Tensor], Tensor]] = {
    "F32": _f32, "F16": _f16_values, "BF16": _bf16, "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1,
    "Q5_0": _q5_0, "Q5_1": _q5_1, "IQ4_NL": _iq4_nl, "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k,
    "Q6_K": _q6_k, "IQ4_XS": _iq4_xs,
}


def dequantize(data: Tensor, type_name: str, shape: tuple[int, ...] | list[int]) -> Tensor:
    """Raw ggml bytes of a tensor (uint8, any shape) -> float32 tensor of `shape` (last dim = row length).

    Rows are split into blocks of the type; the bytes must be exactly what `shape` needs.
    """
    t = ggml_type(type_name)
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    cols = shape[-1] if shape else 1
    need = t.row_bytes(cols) * (numel // max(cols, 1))
    if data.dtype != torch.uint8 or data.numel() != need:
        raise ValueError(f"{t.name} tensor of shape {shape} needs {need} uint8 bytes, got {data.numel()} "
                         f"{data.dtype}")
    blocks = data.reshape(-1, t.type_size)  # (N, type_size)
    return DEQUANTIZE_BLOCKS[t.name](blocks).reshape(shape)


KERNEL_TYPES = tuple(DEQUANTIZE_BLOCKS)  # the decode kernels read every type (kernels/csrc/blocks.h)


def dequantize_blocks(b: GGMLBlocks) -> Tensor:
    """Blocks -> the fp32 (N, K) matrix they encode (e.g. Q8_0: d * q; Q4_1: fl(d * q + m), one rounding;
    the formulas above): the values the decode kernels use, bit for bit."""
    if b.ggml_type not in KERNEL_TYPES:
        raise ValueError(f"the decode kernels read {', '.join(KERNEL_TYPES)} blocks, got {b.ggml_type!r}")
    return dequantize(b.data, b.ggml_type, b.shape)
