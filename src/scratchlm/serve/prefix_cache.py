"""Prefix caching: the K/V of token prefixes already computed, reused by later prompts that start the same way.

A prompt is cut into blocks of `block` tokens. Block i is stored under the key
    (id of block i-1, tokens of block i)         (block 0: parent id -1)
so a key names its whole prefix exactly (a chain of dict lookups, no hash collisions), and a lookup walks
the prompt's blocks until the first miss. K/V of a block are (L, KvH, block, Hd) per tensor: keys are
stored already rotated with their absolute positions 0.., which are the same in every prompt that shares
the prefix, so the reused K/V are what a fresh prefill would compute (up to float rounding of a different
batch shape). A prompt always keeps at least its last token to prefill (its logits pick token 1).

Memory is bounded by `capacity_bytes`; beyond it the least recently used blocks go first (a hit touches
a chain child-first, so parents stay younger than their children and are evicted after them).
Shared system prompts and earlier chat turns (the generated tokens are stored too when a sequence
finishes) are the hits that matter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

Key = tuple[int, tuple[int, ...]]
KVSlice = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (start, end) -> k, v (L, KvH, n, Hd)


@dataclass(eq=False)
class CachedBlock:
    id: int
    key: Key
    k: torch.Tensor  # (L, KvH, block, Hd)
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class PrefixCache:
    """Blocks of cached K/V keyed by their exact token prefix, LRU-bounded in bytes (0 = disabled)."""

    def __init__(self, block: int = 16, capacity_bytes: int = 256 << 20) -> None:
        if block < 1:
            raise ValueError(f"prefix cache block size must be >= 1, got {block}")
        if capacity_bytes < 0:
            raise ValueError(f"prefix cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.block, self.capacity = block, capacity_bytes
        self.blocks: OrderedDict[Key, CachedBlock] = OrderedDict()
        self.bytes = 0
        self._next_id = 0
        self.hit_tokens = 0  # prompt tokens served from the cache so far
        self.lookups = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def match(self, tokens: list[int] | tuple[int, ...]) -> list[CachedBlock]:
        """The longest chain of cached blocks covering a prefix of tokens[:-1] (the last token is never
        taken: its logits are needed)."""
        if not self.enabled:
            return []
        self.lookups += 1
        chain: list[CachedBlock] = []
        parent, b = -1, self.block
        for start in range(0, (len(tokens) - 1) // b * b, b):
            hit = self.blocks.get((parent, tuple(tokens[start : start + b])))
            if hit is None:
                break
            chain.append(hit)
            parent = hit.id
        for blk in reversed(chain):
            self.blocks.move_to_end(blk.key)
        self.hit_tokens += len(chain) * b
        return chain

    def store(self, tokens: list[int] | tuple[int, ...], kv: KVSlice) -> int:
        """Cache the full blocks of `tokens` not cached yet; kv(start, end) gives their K/V (copied here).
        Returns how many blocks were added."""
        if not self.enabled:
            return 0
        parent, added, b = -1, 0, self.block
        chain: list[CachedBlock] = []
        for start in range(0, len(tokens) // b * b, b):
            key = (parent, tuple(tokens[start : start + b]))
            blk = self.blocks.get(key)
            if blk is None:
                k, v = kv(start, start + b)
                blk = CachedBlock(self._next_id, key, k.clone(), v.clone())
                if blk.nbytes > self.capacity:
                    break
                self._next_id += 1
                self.blocks[key] = blk
                self.bytes += blk.nbytes
                added += 1
            chain.append(blk)
            parent = blk.id
        for blk in reversed(chain):  # parents end up younger than their children
            self.blocks.move_to_end(blk.key)
        self._evict()
        return added

    def _evict(self) -> None:
        while self.bytes > self.capacity and self.blocks:
            _, blk = self.blocks.popitem(last=False)
            self.bytes -= blk.nbytes

    def fill(self, chain: list[CachedBlock], k: torch.Tensor, v: torch.Tensor) -> int:
        """Write a matched chain into slots [0, n) of k, v (L, KvH, S, Hd) views; returns n."""
        b = self.block
        for i, blk in enumerate(chain):
            k[:, :, i * b : (i + 1) * b] = blk.k
            v[:, :, i * b : (i + 1) * b] = blk.v
        return len(chain) * b
