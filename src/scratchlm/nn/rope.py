"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer").

Each channel pair (a, b) of a head vector at position p is rotated by the angle p * theta_i,
    theta_i = base^(-2i / d),  i = 0 .. d/2 - 1        (note: base ** (-2 * i / d), not base ** -i / d)
    (a, b) -> (a cos - b sin,  a sin + b cos)
so that <R_m q, R_n k> depends only on m - n.

Pairing styles [firm]:
  "interleaved": pairs (x[2i], x[2i+1])        (Meta's original Llama, RoFormer, most course notes)
  "half":        pairs (x[i],  x[i + d/2])     (GPT-NeoX, HF Llama's rotate_half)
The two are equal up to a fixed permutation of the head dims (hence of the q/k projection rows).
Complex form (equivalent to "interleaved"): view pairs as z_i = x[2i] + j x[2i+1], out = z_i * e^{j p theta_i}.

RoPE is applied per head, after the projections are split into heads: x (B, H, T, Hd).
positions: (T,) shared by the batch, or (B, T) per row. Tables cos/sin (max_seq_len, Hd/2) are
non-persistent fp32 buffers; the rotation is computed in fp32 and cast back to x's dtype.

Fused form (fused=True, ModelConfig.ops_impl="fused"): with full-width tables laid out like the head
dims of the style (rope_tables) and rot(x) the 90-degree partner of every pair,
    x' = x * cos + rot(x) * sin,      rot(a, b) = (-b, a)
i.e. three elementwise ops instead of eight (equality tested in tests/unit/test_fused_ops.py).
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.nn.positional import check_positions

ROPE_STYLES = ("interleaved", "half")


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d) for i in [0, d/2): shape (d/2,), fp32."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float()


def rope_angles(max_seq_len: int, head_dim: int, base: float) -> torch.Tensor:
    """angle[p, i] = p * theta_i: shape (max_seq_len, d/2), fp32."""
    pos = torch.arange(max_seq_len, dtype=torch.float32)
    return torch.outer(pos, rope_inv_freq(head_dim, base))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotate x (..., T, Hd) by cos/sin broadcastable to (..., T, Hd/2) with the given pairing."""
    x32 = x.float()
    if style == "interleaved":
        a, b = x32[..., 0::2], x32[..., 1::2]  # (..., T, Hd/2) each
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (..., T, Hd/2, 2)
        out = out.flatten(-2)  # (..., T, Hd) re-interleaved
    elif style == "half":
        half = x32.shape[-1] // 2
        a, b = x32[..., :half], x32[..., half:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    else:
        raise ValueError(f"unknown rope style {style!r}; valid: {ROPE_STYLES}")
    return out.to(x.dtype)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(T_max, Hd/2) tables -> (T_max, Hd) laid out like the head dims of the style."""
    if style == "half":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)


def rotate_pairs(x: torch.Tensor, style: str) -> torch.Tensor:
    """rot(x): every pair (a, b) of the style -> (-b, a). x (..., Hd)."""
    if style == "half":
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def rope_rotation(head_dim: int, style: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """R (Hd, Hd) with x @ R = rotate_pairs(x, style): one +-1 per column, so the product is exact."""
    return rotate_pairs(torch.eye(head_dim, dtype=dtype), style)


def apply_rope_complex(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Complex-number RoPE (interleaved pairing): z * exp(j*angle); x (..., T, Hd), angles (..., T, Hd/2)."""
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (..., T, Hd/2) complex
    rot = torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


def interleaved_to_half_permutation(head_dim: int) -> torch.Tensor:
    """Index perm with x_half = x_interleaved[..., perm]: evens first, then odds."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin tables and applies RoPE at explicit token positions."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0, style: str = "half",
                 fused: bool = False) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}; pick d_model/n_heads even")
        if style not in ROPE_STYLES:
            raise ValueError(f"unknown rope style {style!r}; valid: {ROPE_STYLES}")
        if base <= 1.0:
            raise ValueError(f"rope base must be > 1, got {base}")
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.base = base
        self.style = style
        self.fused = fused
        angles = rope_angles(max_seq_len, head_dim, base)
        self.register_buffer("cos", torch.cos(angles), persistent=False)  # (T_max, Hd/2)
        self.register_buffer("sin", torch.sin(angles), persistent=False)
        if fused:
            cos_full, sin_full = rope_tables(self.cos, self.sin, style)
            self.register_buffer("cos_full", cos_full, persistent=False)  # (T_max, Hd)
            self.register_buffer("sin_full", sin_full, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, Hd); positions (T,) or (B, T) -> rotated x, same shape and dtype."""
        check_positions(positions, self.max_seq_len)
        cos_t, sin_t = (self.cos_full, self.sin_full) if self.fused else (self.cos, self.sin)
        cos, sin = cos_t[positions], sin_t[positions]  # (T, W) or (B, T, W); W = Hd fused, Hd/2 otherwise
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, W): broadcast over heads
        if self.fused:
            x32 = x.float()
            return torch.addcmul(x32 * cos, rotate_pairs(x32, self.style), sin).to(x.dtype)
        return apply_rope(x, cos, sin, self.style)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_seq_len={self.max_seq_len}, base={self.base}, style={self.style}"
