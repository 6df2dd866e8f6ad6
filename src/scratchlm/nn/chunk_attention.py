"""A causal chunk of queries over a cached prefix, without a mask: the prefix part and the chunk part apart.

A prompt chunk of T queries at the end of S keys (the first P = S - T cached) attends every cached key and,
causally, the chunk's own keys. torch's fused CPU kernel has no bottom-right causal form for T < S, so one
call needs an explicit (T, S) mask, and a masked call costs ~20-30% more than an unmasked one at long S.
Split at P instead, each part in one unmasked (or square-causal) call that also returns its log-sum-exp:

    prefix  o1, l1 = attention(Q, K[:P], V[:P])                   l1 = log sum_j<P exp(q k_j * scale)
    chunk   o2, l2 = attention(Q, K[P:], V[P:], causal square)    l2 = log sum_P<=j<=P+i exp(...)
    merge   l = logaddexp(l1, l2),   out = o1 exp(l1 - l) + o2 exp(l2 - l) = lerp(o2, o1, sigmoid(l1 - l2))

which is softmax over all S keys (each part's softmax reweighted by its share of the total mass). The prefix
part runs GQA as one matrix per kv head (the G query heads sharing it stacked as G T rows: K and V read once).
Equal to the masked reference up to fp32 rounding (tests/unit/test_chunk_attention.py).
"""

from __future__ import annotations

import torch

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def chunk_attention_applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True where causal_chunk_attention can run: CPU, 4-D (B, H, T, Hd) float inputs, 1 < T < S, no
    gradient wanted (the split is an inference path), and torch has its fused CPU kernel."""
    t, s = q.shape[-2], k.shape[-2]
    return (_FLASH_CPU is not None and q.device.type == "cpu" and q.dim() == 4 and 1 < t < s
            and q.dtype in (torch.float32, torch.bfloat16) and q.dtype == k.dtype
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)))


def causal_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
                           ) -> torch.Tensor:
    """q (B, H, T, Hd) the last T positions of k, v (B, KvH, S, Hd): query i attends keys 0 .. S - T + i.
    Returns (B, H, T, Hd_v). See the module docstring; check chunk_attention_applies first."""
    b, h, t, hd = q.shape
    kvh, s = k.shape[1], k.shape[2]
    g, p = h // kvh, s - t
    qg = q.reshape(b, kvh, g * t, hd)  # (B, KvH, G T, Hd): head h = kv head h // G, row (h % G) T + i
    o1, l1 = _FLASH_CPU(qg, k[:, :, :p], v[:, :, :p], scale=scale)  # (B, KvH, G T, Hd_v), (B, KvH, G T)
    o1, l1 = o1.reshape(b, h, t, -1), l1.reshape(b, h, t)
    kn, vn = k[:, :, p:], v[:, :, p:]  # (B, KvH, T, Hd): the chunk's own keys
    if g > 1:
        kn, vn = kn.repeat_interleave(g, dim=1), vn.repeat_interleave(g, dim=1)
    o2, l2 = _FLASH_CPU(q, kn, vn, is_causal=True, scale=scale)  # square: causal is the diagonal form
    share = torch.sigmoid(l1 - l2)[..., None]  # (B, H, T, 1): exp(l1 - l) = 1 / (1 + exp(l2 - l1))
    return torch.lerp(o2.float(), o1.float(), share).to(q.dtype)  # o2 + share (o1 - o2)
