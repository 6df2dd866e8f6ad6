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

RoPE is applied per head, after the projections are split into heads: x (B, H, T, Hd). Partial rotary
(ModelConfig.rotary_dim = d < Hd, Phi-4-mini): the first d dims of each head rotate, the rest pass through.
positions: (T,) shared by the batch, or (B, T) per row. Tables cos/sin (max_seq_len, Hd/2) are
non-persistent fp32 buffers; the rotation is computed in fp32 and cast back to x's dtype.
Scaled variants (linear, dynamic NTK, llama3, YaRN, longrope) change the frequencies: see rope_scaling.py.

Fused form (fused=True, ModelConfig.ops_impl="fused"): with full-width tables laid out like the head
dims of the style (rope_tables) and rot(x) the 90-degree partner of every pair,
    x' = x * cos + rot(x) * sin,      rot(a, b) = (-b, a)
i.e. three elementwise ops instead of eight (equality tested in tests/unit/test_fused_ops.py); eagerly on the CPU
the fused form runs as one C++ pass each way (nn/fused_rope.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scratchlm.nn import fused_rope
from scratchlm.nn.positional import check_positions
from scratchlm.nn.rope_scaling import check_rope_scaling, default_inv_freq, dynamic_inv_freq, scaled_inv_freq

ROPE_STYLES = ("interleaved", "half")


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d) for i in [0, d/2): shape (d/2,), fp32 (computed in float64)."""
    return default_inv_freq(head_dim, base).float()


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


def widen_table(t: torch.Tensor, style: str) -> torch.Tensor:
    """(..., Hd/2) table -> (..., Hd) laid out like the head dims of the style."""
    return torch.cat((t, t), -1) if style == "half" else t.repeat_interleave(2, -1)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(T_max, Hd/2) tables -> (T_max, Hd) laid out like the head dims of the style."""
    return widen_table(cos, style), widen_table(sin, style)


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


def interleaved_to_half_permutation(head_dim: int, rotary_dim: int | None = None) -> torch.Tensor:
    """Index perm with x_half = x_interleaved[..., perm]: evens first, then odds (over the first rotary_dim
    dims; the dims that do not rotate stay in place)."""
    d = head_dim if rotary_dim is None else rotary_dim
    return torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2), torch.arange(d, head_dim)))


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin tables (optionally scaled, see rope_scaling.py) and applies RoPE at explicit positions.

    Tables are (T_max, W) non-persistent fp32 buffers, W = Hd in the fused form, Hd/2 otherwise, already
    multiplied by the scaling's attention factor. longrope keeps a second (long-factor) pair; dynamic NTK
    computes the angles of a forward whose longest position exceeds L0 on the fly.
    """

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0, style: str = "half",
                 fused: bool = False, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}; pick d_model/n_heads even")
        if style not in ROPE_STYLES:
            raise ValueError(f"unknown rope style {style!r}; valid: {ROPE_STYLES}")
        if base <= 1.0:
            raise ValueError(f"rope base must be > 1, got {base}")
        if scaling is not None:
            check_rope_scaling(scaling, head_dim)
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.base = base
        self.style = style
        self.fused = fused
        self.scaling = scaling
        self.kind = None if scaling is None else scaling["rope_type"]
        if torch.empty(0).device.type == "meta":  # built without memory (a loader fills the weights in): the
            with torch.device("cpu"):             # tables are computed for real at once, on the CPU, which
                self.init_tables()                # also spares torch's meta-tensor machinery (~2 s to import)
        else:
            self.init_tables()

    def _widen(self, t: torch.Tensor) -> torch.Tensor:
        """(..., Hd/2) -> (..., Hd) laid out like the head dims of the style (fused form only)."""
        return widen_table(t, self.style) if self.fused else t

    def _register(self, suffix: str, inv_freq: torch.Tensor, factor: float, device: torch.device | None) -> None:
        pos = torch.arange(self.max_seq_len, dtype=torch.float32, device=device)
        angles = torch.outer(pos, inv_freq.float().to(device))  # (T_max, Hd/2)
        self.register_buffer("cos" + suffix, self._widen(torch.cos(angles) * factor), persistent=False)
        self.register_buffer("sin" + suffix, self._widen(torch.sin(angles) * factor), persistent=False)

    def init_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the tables, e.g. after the module was built on the meta device."""
        inv, factor = scaled_inv_freq(self.head_dim, self.base, self.scaling, self.max_seq_len)
        self._register("", inv, factor, device)
        if self.kind == "longrope":
            inv, factor = scaled_inv_freq(self.head_dim, self.base, self.scaling, self.max_seq_len, long=True)
            self._register("_long", inv, factor, device)

    def fused_copy(self) -> "RotaryEmbedding":
        """This RoPE with full-width (fused-form) tables, on the same device (self if already fused)."""
        if self.fused:
            return self
        copy = RotaryEmbedding(self.head_dim, self.max_seq_len, self.base, self.style, True, self.scaling)
        copy.init_tables(self.cos.device)
        return copy

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin at `positions` (T,) or (B, T): (..., T, W) fp32 (W = Hd fused, Hd/2 otherwise)."""
        check_positions(positions, self.max_seq_len)
        cos, sin = self.cos[positions], self.sin[positions]
        if self.kind is None or self.kind not in ("longrope", "dynamic"):
            return cos, sin
        l0 = self.scaling["original_max_position_embeddings"]
        longest = positions.max() + 1  # one choice per forward, over the whole batch (as transformers)
        if self.kind == "longrope":
            beyond = longest > l0
            return (torch.where(beyond, self.cos_long[positions], cos),
                    torch.where(beyond, self.sin_long[positions], sin))
        inv = dynamic_inv_freq(self.head_dim, self.base, self.scaling, longest).float()
        angles = positions[..., None].float() * inv  # (..., T, Hd/2)
        beyond = longest > l0
        return (torch.where(beyond, self._widen(torch.cos(angles)), cos),
                torch.where(beyond, self._widen(torch.sin(angles)), sin))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, Hd); positions (T,) or (B, T) -> rotated x, same shape and dtype. Partial rotary
        (Phi-4-mini): when Hd exceeds the rotary dim d of this module, only x[..., :d] is rotated."""
        d = self.head_dim
        if x.shape[-1] != d:
            return torch.cat((self._rotate(x[..., :d], positions), x[..., d:]), dim=-1)
        return self._rotate(x, positions)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.tables(positions)  # (T, W) or (B, T, W)
        if self.fused and fused_rope.applies(x):
            return fused_rope.fused_rope(x, cos, sin, self.style)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, W): broadcast over heads
        if self.fused:
            x32 = x.float()
            return torch.addcmul(x32 * cos, rotate_pairs(x32, self.style), sin).to(x.dtype)
        return apply_rope(x, cos, sin, self.style)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, max_seq_len={self.max_seq_len}, base={self.base}, style={self.style}"
                + (f", scaling={self.kind}" if self.kind else ""))
