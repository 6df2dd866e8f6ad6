"""8-bit activation blocks: the activation quantization of the "A8" decode formats (W8A8 / W4A8).

llama.cpp's CPU backend never multiplies fp32 activations by Q8_0 / Q4_1 weights: it first quantizes
the activation row to 8 bits per 32-block (ggml's Q8_0 / Q8_1 "vec_dot_type") and then runs integer dot
products. The A8 formats (decode="fast-q8_0-a8" / "fast-q4_1-a8") do the same, so in those modes the
rounding of x is part of the model's definition. For x (..., K), K a multiple of 32, per block of 32:
    amax = max_j |x_j|,   d = amax / 127,   q_j = rne(x_j * (127 / amax))  (q = 0 where amax = 0)
    x ~ d q  (|x_j - d q_j| <= d / 2)
with fp32 arithmetic and round-half-to-even (what ggml's AVX2/AVX-512 quantize_row_q8_0 does; its scalar
reference rounds halves away from zero and takes 1 / d instead of 127 / amax: a tie or a last-bit
difference away from it). ggml then stores d as fp16; we keep it fp32 (a little more precise).
A matrix in an A8 format then computes  y = (d q) @ W^T  with W the dequantized weights:
`linear_a8` below is the pure-torch reference of the C++ kernels (kernels/csrc/gemv_a8.h), which compute
the same value with integer block sums (tests/kernels/test_a8_kernels.py: equal to fp32 rounding).
The K-quants (Q2_K .. Q6_K) and IQ4_XS take x rounded per 256 values instead, as ggml's Q8_K
(`quantize_act_k` / `round_act_k`; kernels/csrc/gemv_a8_blocks.h, tests/kernels/test_a8_types.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QK = 32  # values per activation block


def quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (q int8 (..., K), d fp32 (..., K / 32)) per the module docstring; ValueError unless
    K is a multiple of 32."""
    if x.shape[-1] % QK:
        raise ValueError(f"8-bit activation blocks need the last dim to be a multiple of {QK}, got {tuple(x.shape)}")
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // QK, QK)  # (..., K/32, 32)
    amax = xb.abs().amax(dim=-1, keepdim=True)  # (..., K/32, 1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv).to(torch.int8)  # torch.round: half to even
    return q.reshape(x.shape), (amax / 127.0).squeeze(-1)


def dequantize_act(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """(q (..., K), d (..., K / 32)) -> d q fp32 (..., K)."""
    qb = q.float().reshape(*q.shape[:-1], q.shape[-1] // QK, QK)
    return (qb * d.unsqueeze(-1)).reshape(q.shape)


def round_act(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) -> d q (..., K) fp32: x as the A8 kernels see it."""
    return dequantize_act(*quantize_act(x))


def linear_a8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (B, K) fp32, w (N, K) the dequantized weights -> (d q) @ w^T (B, N): an A8 matrix's function."""
    return F.linear(round_act(x), w)


QK_K = 256  # values per activation block of the K-quant types (ggml's Q8_K)


def quantize_act_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's Q8_K rounding (quantize_row_q8_K_ref, what its CPU backend does before a K-quant dot product):
    x (..., K) -> (q int8 (..., K), d fp32 (..., K / 256)). Per block of 256, in fp32 with true divisions:
        m = the first x of largest |x|,  iscale = -127 / m,  q = min(127, rne(x iscale)),  d = 1 / iscale
    (q = 0, d = 0 where the block is all zero; d has the sign of -m). ValueError unless K % 256 == 0."""
    if x.shape[-1] % QK_K:
        raise ValueError(f"Q8_K activation blocks need the last dim to be a multiple of {QK_K}, got {tuple(x.shape)}")
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // QK_K, QK_K)  # (..., K/256, 256)
    m = xb.gather(-1, xb.abs().argmax(dim=-1, keepdim=True))  # (..., K/256, 1): argmax takes the first maximum
    nonzero = m != 0
    safe_m = torch.where(nonzero, m, torch.ones_like(m))
    iscale = torch.where(nonzero, torch.div(torch.full_like(m, -127.0), safe_m), torch.zeros_like(m))
    q = torch.round(xb * iscale).clamp(max=127).to(torch.int8)  # torch.round: half to even, as ggml's nearest_int
    d = torch.where(nonzero, torch.div(torch.ones_like(m), torch.where(nonzero, iscale, torch.ones_like(m))),
                    torch.zeros_like(m))
    return q.reshape(x.shape), d.squeeze(-1)


def round_act_k(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) -> d q (..., K) fp32: x as the K-quant A8 kernels see it (Q8_K per 256)."""
    q, d = quantize_act_k(x)
    qb = q.float().reshape(*q.shape[:-1], q.shape[-1] // QK_K, QK_K)
    return (qb * d.unsqueeze(-1)).reshape(q.shape)


def round_act_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded per `block` values the way the A8 kernels of a weight type with that block size do:
    32 -> round_act (per-32 amax / 127), 256 -> round_act_k (ggml's Q8_K)."""
    if block == QK:
        return round_act(x)
    if block == QK_K:
        return round_act_k(x)
    raise ValueError(f"8-bit activation blocks are {QK} or {QK_K} values, got {block}")
