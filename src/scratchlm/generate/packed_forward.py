"""Several tokens per row through FastDecoder's packed weights: the forward speculative decoding verifies with.

FastDecoder.step (generate/fast_decode.py) feeds one token per row; checking k drafted tokens needs the
k + 1 positions [last, d_1 .. d_k] of a row in one pass, each attending causally to the row's cache and to
the drafted tokens before it. `packed_forward` is the model's forward with FastDecoder's parts: its packed
matrices (norm gains and 1/sqrt(Hd) folded in, any weight format: a GGUF's own blocks through the C++
kernels), its RoPE tables and norms, over any KV cache with the KVCache interface (the contiguous one, or a
PagedKVCache view: nn/paged_kv_cache.py). Per layer, x (B T, D):

    qkv = Wqkv(norm(x));  q, k = RoPE(q, k);  k, v -> cache (update);  a = softmax(q K^T + M) V
    x = x + Wo(a);  x = x + FFN(norm(x))            M: causal over the slots, + key mask, + sliding window

then logits = head(norm(x)) for the last `keep` positions. Batching the T tokens into the matrix products
reads every weight once for all of them, which is why verifying k drafts costs about one decode step.
Tests: tests/generate/test_speculative.py (logits equal the model's own forward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.nn.attention import scaled_dot_product_attention
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.masks import causal_mask
from scratchlm.nn.softcap import softcap


def supported(dec: FastDecoder) -> bool:
    """The decoders packed_forward computes: every one but learned/sinusoidal positions and a second RoPE."""
    return dec.positions is None and dec.local_rope is None


def _attention_mask(t: int, s: int, start: int, key_mask: torch.Tensor | None, window: int | None,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask, safe, live) for T queries at slots [start, s): mask (B or 1, 1, T, S) bool = causal (and window)
    and the key mask; live = query rows with a visible key; safe = mask | ~live (finite fused attention)."""
    mask = causal_mask(t, s, start, device, window)[None, None]  # (1, 1, T, S)
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, :]
    live = mask.any(dim=-1, keepdim=True)
    return mask, mask | ~live, live


@torch.inference_mode()
def packed_forward(dec: FastDecoder, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None,
                   cache: KVCache, keep: int = 0) -> torch.Tensor:
    """ids, positions (B, T), key_mask (B, S) over the cache slots [0, S = start + T) or None -> logits of the
    last `keep` positions (B, keep, V) (0: all T); the T tokens' K/V go into the cache, which advances by T."""
    if not supported(dec):
        raise ValueError("packed_forward does not handle learned/sinusoidal positions or a local RoPE; use the "
                         "model's forward")
    b, t = ids.shape
    h, kvh, hd = dec.h, dec.kvh, dec.hd
    start = cache.seq_len
    s = start + t
    masks = {w: _attention_mask(t, s, start, key_mask, w, ids.device) for w in {layer.window for layer in dec.layers}}
    flat = ids.reshape(-1)
    x = F.embedding(flat, dec.embed) if isinstance(dec.embed, torch.Tensor) else dec.embed(flat)  # (B T, D)
    if dec.config.embedding_multiplier != 1.0:
        x = x * dec.config.embedding_multiplier
    ropes = {"global": dec._tables(dec.rope, positions.reshape(-1)), None: None}
    for i, layer in enumerate(dec.layers):
        qkv = layer.qkv(layer.norm(x) if layer.pre_norm else x)  # (B T, (H + 2 KvH) Hd), q rows pre-scaled
        qk = dec.rotate(qkv[:, : (h + kvh) * hd].view(b * t, h + kvh, hd).float(), ropes[layer.rope_kind], layer)
        q = qk[:, :h].view(b, t, h, hd).transpose(1, 2).to(dec.dtype)  # (B, H, T, Hd)
        k = qk[:, h:].view(b, t, kvh, hd).transpose(1, 2).to(dec.dtype)  # (B, KvH, T, Hd)
        v = qkv[:, (h + kvh) * hd:].view(b, t, kvh, hd).transpose(1, 2)
        k, v = cache.update(i, k, v)  # (B, KvH, S, Hd)
        mask, safe, live = masks[layer.window]
        if layer.softcap is None:  # torch's fused kernel (the fast path; dead query rows give zeros, as ours)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, scale=1.0, enable_gqa=h != kvh) * live
        else:
            out = scaled_dot_product_attention(q, k, v, mask=mask, scale=1.0, softcap=layer.softcap)
        x = layer.attn_residual(x, out.transpose(1, 2).reshape(b * t, h * hd))  # x + o_proj(heads)
        x = layer.ffn_residual(x)
    cache.advance(t)
    x = x.view(b, t, -1)
    if keep:
        x = x[:, -keep:]
    logits = dec.head(dec.norm(x.reshape(-1, x.shape[-1])))  # (B keep, V)
    if dec.config.logits_scaling != 1.0:
        logits = logits / dec.config.logits_scaling
    if dec.config.final_softcap is not None:
        logits = softcap(logits, dec.config.final_softcap)
    return logits.view(b, -1, logits.shape[-1])
