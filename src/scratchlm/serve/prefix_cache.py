"""Prefix caching as block sharing: full K/V blocks of the pool (nn/paged_kv_cache.py) kept under their exact token
prefix, so a later prompt that starts the same way takes the same blocks into its block table instead of
recomputing (or copying) them.

A prompt is cut into blocks of the pool's block size b. Block i is registered under the key
    (entry id of block i-1, tokens of block i)         (block 0: parent -1)
so a key names its whole prefix exactly (a chain of dict lookups, no hash collisions), and a lookup walks the
prompt's blocks until the first miss. After the chain, the cached block under the same parent that starts with
the most of the prompt's next tokens gives those m < b positions too (`lookup`): the prompt's owner copies
that block and keeps its first m slots (a system prompt that ends inside a block, a question asked again with
a different ending). Keys are stored already rotated with their absolute positions 0.., the
same in every prompt that shares the prefix, so the shared K/V are what a fresh prefill computes (up to float
rounding of another batch shape). A prompt always keeps at least its last token to prefill (its logits choose
token 1).

The cache holds one reference to each block it names (BlockPool.share), so a block outlives the sequence that
wrote it. At most `capacity` blocks are named; beyond, the least recently used entries go first (a hit
touches a chain child-first, so parents stay younger than their children and are evicted after them). When
the pool runs short, `reclaim` drops the least recently used entries that nothing else references. Shared
system prompts, earlier chat turns and earlier replies (a finished sequence offers its blocks) are the hits
that matter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from scratchlm.nn.paged_kv_cache import BlockPool

Key = tuple[int, tuple[int, ...]]


@dataclass(eq=False)
class CachedBlock:
    id: int  # entry id (the parent field of its children's keys)
    key: Key
    block: int  # pool block id


class PrefixCache:
    """Pool blocks keyed by their exact token prefix, LRU-bounded in blocks (capacity 0 = disabled)."""

    def __init__(self, pool: BlockPool, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"prefix cache capacity must be >= 0 blocks, got {capacity_blocks}")
        self.pool, self.block, self.capacity = pool, pool.block_size, capacity_blocks
        self.entries: OrderedDict[Key, CachedBlock] = OrderedDict()
        self.children: dict[int, dict[Key, CachedBlock]] = {}  # parent entry id -> its entries (-1: first blocks)
        self._next_id = 0
        self.hit_tokens = 0  # prompt tokens served from the cache so far
        self.lookups = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def match(self, tokens: list[int] | tuple[int, ...]) -> list[int]:
        """Pool blocks of the longest cached chain covering a prefix of tokens[:-1] (the last token is never
        taken: its logits are needed). The caller shares them (BlockPool.share) to use them."""
        return self.lookup(tokens)[0]

    def lookup(self, tokens: list[int] | tuple[int, ...]) -> tuple[list[int], tuple[int, int] | None]:
        """match(tokens), and the block after the chain that shares the most leading tokens with the prompt's
        next ones: (pool block, m) with 1 <= m < b of its slots valid for this prompt (the last prompt token
        still excluded), or None. Its K/V are this prompt's for those m positions; the caller copies them into
        a block of its own (the rest of the block belongs to another continuation)."""
        if not self.enabled:
            return [], None
        self.lookups += 1
        chain: list[CachedBlock] = []
        parent, b = -1, self.block
        for start in range(0, (len(tokens) - 1) // b * b, b):
            hit = self.entries.get((parent, tuple(tokens[start : start + b])))
            if hit is None:
                break
            chain.append(hit)
            parent = hit.id
        for entry in reversed(chain):
            self.entries.move_to_end(entry.key)
        nxt = tokens[len(chain) * b : len(tokens) - 1]  # the tokens a partial block may still cover
        best: tuple[int, int] | None = None
        for entry in self.children.get(parent, {}).values() if nxt else ():
            m = 0
            for a, c in zip(entry.key[1], nxt):
                if a != c:
                    break
                m += 1
            if m and (best is None or m > best[1]):
                best = (entry.block, m)
        self.hit_tokens += len(chain) * b  # a partial block counts once its owner has copied it (KVSpace.start)
        return [entry.block for entry in chain], best

    def store(self, tokens: list[int] | tuple[int, ...], blocks: list[int]) -> int:
        """Name the full blocks of a sequence holding `tokens` in `blocks` (its block table); a prefix already
        named keeps its blocks. Returns how many blocks were added."""
        if not self.enabled:
            return 0
        parent, added, b = -1, 0, self.block
        chain: list[CachedBlock] = []
        for i, start in enumerate(range(0, min(len(tokens) // b, len(blocks)) * b, b)):
            key = (parent, tuple(tokens[start : start + b]))
            entry = self.entries.get(key)
            if entry is None:
                entry = CachedBlock(self._next_id, key, blocks[i])
                self._next_id += 1
                self.pool.share([entry.block])
                self.entries[key] = entry
                self.children.setdefault(parent, {})[key] = entry
                added += 1
            chain.append(entry)
            parent = entry.id
        for entry in reversed(chain):  # parents end up younger than their children
            self.entries.move_to_end(entry.key)
        while len(self.entries) > self.capacity:
            self._drop(next(iter(self.entries.values())))
        return added

    def _drop(self, entry: CachedBlock) -> None:
        del self.entries[entry.key]
        siblings = self.children[entry.key[0]]
        del siblings[entry.key]
        if not siblings:
            del self.children[entry.key[0]]
        self.pool.release([entry.block])

    def reclaimable(self) -> int:
        """Blocks that only the cache references (dropping their entries frees them)."""
        return sum(1 for e in self.entries.values() if self.pool.refs[e.block] == 1)

    def reclaim(self, n: int) -> int:
        """Drop least recently used entries that nothing else references until n blocks are free again;
        returns how many were freed."""
        freed = 0
        for entry in list(self.entries.values()):
            if freed >= n:
                break
            if self.pool.refs[entry.block] == 1:
                self._drop(entry)
                freed += 1
        return freed

    def clear(self) -> None:
        for entry in list(self.entries.values()):
            self._drop(entry)
