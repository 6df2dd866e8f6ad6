"""Scaled dot-product attention and the one attention module for MHA / GQA / MQA.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(Hd) + M) V,   M = 0 where mask is True, -inf where False

Shapes: B batch, T query length, S key length, D model dim, H query heads, KvH key/value heads,
Hd head dim. Query head h reads kv head h // (H / KvH) (the HF `repeat_kv` grouping).
MHA: KvH = H.  GQA: 1 < KvH < H.  MQA: KvH = 1.
A query row whose keys are all masked outputs zeros (defined behaviour, never NaN).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.linear import Linear
from scratchlm.nn.masks import causal_mask, combine_masks
from scratchlm.nn.norm import RMSNorm
from scratchlm.nn.rope import RotaryEmbedding
from scratchlm.nn.softmax import softmax

ATTN_IMPLS = ("reference", "sdpa")


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Reference attention. q (B, H, T, Hd); k, v (B, KvH, S, Hd); mask bool broadcastable to (B, H, T, S)."""
    b, h, t, hd = q.shape
    kvh, s = k.shape[1], k.shape[2]
    if h % kvh:
        raise ValueError(f"query heads {h} must be a multiple of kv heads {kvh}")
    g = h // kvh
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    qg = q.reshape(b, kvh, g, t, hd)  # (B, KvH, G, T, Hd): group the query heads sharing a kv head
    scores = (qg @ k[:, :, None].transpose(-2, -1)) * scale  # (B, KvH, G, T, S)
    if is_causal:
        mask = combine_masks(mask, causal_mask(t, s, start=s - t, device=q.device))
    if mask is not None:
        mask = mask.expand(b, h, t, s).reshape(b, kvh, g, t, s)
    probs = softmax(scores.float(), dim=-1, mask=mask).to(q.dtype)
    out = probs @ v[:, :, None]  # (B, KvH, G, T, Hd)
    return out.reshape(b, h, t, hd)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Fast path: torch's fused F.scaled_dot_product_attention, same contract as the reference."""
    gqa = q.shape[1] != k.shape[1]
    t, s = q.shape[2], k.shape[2]
    if mask is None and (not is_causal or t == s):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    if is_causal:  # torch's is_causal aligns top-left when t != s; ours is bottom-right (queries are last)
        mask = combine_masks(mask, causal_mask(t, s, start=s - t, device=q.device))
    live = mask.any(dim=-1, keepdim=True)  # rows with at least one visible key
    safe = mask | ~live  # let dead rows attend everything (finite), then zero them below
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, scale=scale, enable_gqa=gqa)
    return out * live.to(out.dtype)


class Attention(nn.Module):
    """Multi-head attention with n_kv_heads (MHA/GQA/MQA), optional qkv bias, QK-norm and RoPE."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rope: RotaryEmbedding | None = None,
        attn_impl: str = "reference",
        fused: bool = False,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
            head_dim = d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"unknown attn_impl {attn_impl!r}; valid: {ATTN_IMPLS}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.attn_impl = attn_impl
        self.q_proj = Linear(d_model, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = Linear(n_heads * head_dim, d_model, bias=out_bias)
        self.q_norm = RMSNorm(head_dim, norm_eps, fused=fused) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, norm_eps, fused=fused) if qk_norm else None
        self.rope = rope

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q (B, H, T, Hd), k, v (B, KvH, T, Hd): split heads, QK-norm, then RoPE per head."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Hd)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KvH, T, Hd)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KvH, T, Hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            if positions is None:
                positions = torch.arange(t, device=x.device)
            q, k = self.rope(q, positions), self.rope(k, positions)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = True,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D).

        positions: RoPE positions (T,) or (B, T) (default 0..T-1); mask: bool, broadcastable to
        (B, H, T, S), True = attend; is_causal adds the causal constraint; kv_cache: when given, the new
        K/V are written at the cache's next slots and attention runs over all filled slots.
        """
        b, t, _ = x.shape
        q, k, v = self.project_qkv(x, positions)
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)  # (B, KvH, S, Hd)
        attend = sdpa_attention if self.attn_impl == "sdpa" else scaled_dot_product_attention
        out = attend(q, k, v, mask=mask, is_causal=is_causal)  # (B, H, T, Hd)
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, H*Hd)
        return self.o_proj(out)
