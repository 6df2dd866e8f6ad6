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

from scratchlm.nn.chunk_attention import causal_chunk_attention, chunk_attention_applies
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.linear import Linear
from scratchlm.nn.masks import causal_mask, combine_masks
from scratchlm.nn.norm import RMSNorm
from scratchlm.nn.positional import check_positions_shape
from scratchlm.nn.probs_attention import applies as probs_attention_applies
from scratchlm.nn.probs_attention import probs_attention
from scratchlm.nn.rope import RotaryEmbedding
from scratchlm.nn.softcap import softcap as soft_cap
from scratchlm.nn.softmax import softmax

ATTN_IMPLS = ("reference", "sdpa")


def check_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: torch.Tensor | None = None) -> tuple[torch.Size, int, int]:
    """Validate q (..., H, T, Hd), k (..., KvH, S, Hd), v (..., KvH, S, Hd_v) (or 2-D (T, Hd), (S, Hd));
    return (leading batch dims, H, KvH). Leading dims must be equal; H a multiple of KvH (GQA)."""
    expected = "q (..., H, T, Hd), k (..., KvH, S, Hd), v (..., KvH, S, Hd_v) or 2-D (T, Hd), (S, Hd), (S, Hd_v)"
    shapes = f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"attention expects {expected} with the same number of dims; {shapes}")
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"attention expects q and k to share Hd and k and v to share (..., KvH, S); {shapes}")
    if q.dim() == 2:
        lead, h, kvh = torch.Size(), 1, 1
    else:
        lead, h, kvh = q.shape[:-3], q.shape[-3], k.shape[-3]
        if q.shape[:-3] != k.shape[:-3] or h % kvh:
            raise ValueError(f"attention expects equal leading dims and query heads H a multiple of kv heads "
                             f"KvH ({expected}); {shapes}")
    if mask is not None:
        full = (*q.shape[:-1], k.shape[-2])  # (..., H, T, S)
        if mask.dtype != torch.bool:
            raise ValueError(f"attention masks are boolean (True = may attend), got dtype {mask.dtype}")
        try:
            if torch.broadcast_shapes(mask.shape, full) != torch.Size(full):
                raise RuntimeError
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' (..., H, T, S) "
                             f"= {full}") from None
    return lead, h, kvh


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Reference attention. q (..., H, T, Hd); k, v (..., KvH, S, Hd); any number of leading batch dims
    (also 2-D (T, Hd)); mask bool broadcastable to (..., H, T, S). See check_attention_shapes.
    softcap c (Gemma-2): the scaled scores become c * tanh(scores / c) before the mask."""
    lead, h, kvh = check_attention_shapes(q, k, v, mask)
    t, hd, s = q.shape[-2], q.shape[-1], k.shape[-2]
    g = h // kvh
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    qg = q.reshape(*lead, kvh, g, t, hd)  # (..., KvH, G, T, Hd): group the query heads sharing a kv head
    kg, vg = k.reshape(*lead, kvh, 1, s, hd), v.reshape(*lead, kvh, 1, s, v.shape[-1])  # (..., KvH, 1, S, Hd)
    scores = (qg @ kg.transpose(-2, -1)) * scale  # (..., KvH, G, T, S)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if is_causal:
        mask = combine_masks(mask, causal_mask(t, s, start=s - t, device=q.device))
    if mask is not None:
        mask = mask.expand(*q.shape[:-1], s).reshape(*lead, kvh, g, t, s)
    probs = softmax(scores.float(), dim=-1, mask=mask).to(q.dtype)
    out = probs @ vg  # (..., KvH, G, T, Hd_v)
    return out.reshape(*q.shape[:-1], v.shape[-1])


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Fast path: torch's fused F.scaled_dot_product_attention, same contract (and shapes) as the reference.
    torch's kernel has no soft-capping: with `softcap` this runs the reference math. A causal chunk over a
    cached prefix with nothing else masked runs as two unmasked calls (nn/chunk_attention.py). bf16 causal
    self-attention at short T (training) runs with its probabilities materialised (nn/probs_attention.py)."""
    if softcap is not None:
        return scaled_dot_product_attention(q, k, v, mask, is_causal, scale, softcap)
    if probs_attention_applies(q, k, v, mask, is_causal, softcap):
        return probs_attention(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)
    _, h, kvh = check_attention_shapes(q, k, v, mask)
    gqa = h != kvh
    t, s = q.shape[-2], k.shape[-2]
    if mask is None and (not is_causal or t == s):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    if mask is None and is_causal and chunk_attention_applies(q, k):
        return causal_chunk_attention(q, k, v, scale)  # a prompt chunk over a cached prefix, unmasked calls
    if is_causal:  # torch's is_causal aligns top-left when t != s; ours is bottom-right (queries are last)
        mask = combine_masks(mask, causal_mask(t, s, start=s - t, device=q.device))
    live = mask.any(dim=-1, keepdim=True)  # rows with at least one visible key
    safe = mask | ~live  # let dead rows attend everything (finite), then zero them below
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, scale=scale, enable_gqa=gqa)
    return out * live.to(out.dtype)


def check_attention_input(x: torch.Tensor, d_model: int, positions: torch.Tensor | None) -> tuple[int, int]:
    """(B, T) of the module input x (B, T, D); ValueError naming the expected shapes otherwise."""
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"Attention expects x of shape (B, T, D={d_model}), got {tuple(x.shape)}")
    b, t = x.shape[0], x.shape[1]
    if positions is not None:
        check_positions_shape(positions, b, t)
    return b, t


QK_NORM_SCOPES = ("head", "projection")


class Attention(nn.Module):
    """Multi-head attention with n_kv_heads (MHA/GQA/MQA), optional qkv bias, QK-norm and RoPE.

    QK-norm: RMSNorm on q and k before RoPE, over each head's Hd dims (scope "head": Qwen3, Gemma-3) or
    over the whole projection H*Hd / KvH*Hd (scope "projection": OLMo-2). scale: the score multiplier
    (default 1/sqrt(Hd); Gemma-2/3 query_pre_attn_scalar^-1/2, Granite attention_multiplier); softcap:
    c * tanh(scores / c) on the scaled scores (Gemma-2).
    """

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
        qk_norm_scope: str = "head",
        norm_unit_offset: bool = False,
        scale: float | None = None,
        softcap: float | None = None,
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
        self.q_proj = Linear(d_model, n_heads * head_dim, bias=qkv_bias, fused=fused)
        self.k_proj = Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias, fused=fused)
        self.v_proj = Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias, fused=fused)
        self.o_proj = Linear(n_heads * head_dim, d_model, bias=out_bias, fused=fused)
        if qk_norm_scope not in QK_NORM_SCOPES:
            raise ValueError(f"unknown qk_norm_scope {qk_norm_scope!r}; valid: {QK_NORM_SCOPES}")
        self.qk_norm_scope, self.scale, self.softcap = qk_norm_scope, scale, softcap
        q_dim, k_dim = (n_heads * head_dim, n_kv_heads * head_dim) if qk_norm_scope == "projection" else (head_dim,) * 2
        self.q_norm = RMSNorm(q_dim, norm_eps, fused=fused, unit_offset=norm_unit_offset) if qk_norm else None
        self.k_norm = RMSNorm(k_dim, norm_eps, fused=fused, unit_offset=norm_unit_offset) if qk_norm else None
        self.rope = rope

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q (B, H, T, Hd), k, v (B, KvH, T, Hd): split heads, QK-norm, then RoPE per head."""
        b, t = check_attention_input(x, self.q_proj.in_features, positions)
        q, k = self.q_proj(x), self.k_proj(x)  # (B, T, H*Hd), (B, T, KvH*Hd)
        if self.q_norm is not None and self.qk_norm_scope == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Hd)
        k = k.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KvH, T, Hd)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KvH, T, Hd)
        if self.q_norm is not None and self.qk_norm_scope == "head":
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
        b, t = check_attention_input(x, self.q_proj.in_features, positions)
        q, k, v = self.project_qkv(x, positions)
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)  # (B, KvH, S, Hd)
        attend = sdpa_attention if self.attn_impl == "sdpa" else scaled_dot_product_attention
        out = attend(q, k, v, mask=mask, is_causal=is_causal, scale=self.scale, softcap=self.softcap)
        # out: (B, H, T, Hd)
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, H*Hd)
        return self.o_proj(out)
