"""Pre-allocated key/value cache for incremental decoding.

Per layer: K and V of shape (B, KvH, T_max, Hd). Memory per token (all layers, K and V):
    2 * n_layers * KvH * Hd * bytes_per_element
so GQA with KvH = H / g stores g times less than MHA.

Slots are absolute time indices 0 .. T_max-1. A forward over T new tokens writes slots
[seq_len, seq_len + T) in every layer and then `advance(T)` moves seq_len forward. RoPE positions are
passed separately (they may differ per row under left padding); the cache only stores rotated keys.
Sliding-window layers keep every token here too: their window is a mask (nn/masks.py), and the
FastDecoder reads only their last W slots. (A rolling W-slot buffer would save memory; not implemented.)
"""

from __future__ import annotations

import torch


class KVCache:
    """Static (pre-allocated) KV cache shared by all layers of one model."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, KvH, T_max, Hd)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.seq_len = 0

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, KvH, T, Hd) at slots [seq_len, seq_len+T); return the filled (B, KvH, seq_len+T, Hd)."""
        end = self.seq_len + k.shape[2]
        if end > self.max_seq_len:
            raise ValueError(
                f"KV cache overflow: {end} tokens > cache capacity {self.max_seq_len}; "
                "allocate a larger cache (max_seq_len) or shorten prompt + max_new_tokens"
            )
        self.k[layer_idx, :, :, self.seq_len:end] = k
        self.v[layer_idx, :, :, self.seq_len:end] = v
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, n: int) -> None:
        """Mark n more slots as filled (called once per model forward, after all layers wrote)."""
        self.seq_len += n

    def reset(self) -> None:
        self.seq_len = 0

    def bytes_per_token(self) -> int:
        """Bytes of K+V stored per token of one row, over all layers."""
        n_layers, _, kvh, _, hd = self.k.shape
        return 2 * n_layers * kvh * hd * self.k.element_size()
