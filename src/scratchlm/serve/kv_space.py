"""The server's K/V memory: one block pool (nn/paged_kv_cache.py) for every sequence, with the prefix cache on it.

    pool        --kv-cache-mb of blocks (BLOCK tokens each), allocated once at start (pages are touched as
                blocks are first used); no more than every row could use (max_batch x context)
    table       each sequence's BlockTable: its prompt + generated tokens; blocks come as it grows (grow),
                go back when it ends or is preempted (release)
    sharing     a prompt's cached prefix enters its table as the cache's own blocks (start: shared, not
                copied); the n choices of one prompt share its full blocks and copy only the partly filled
                last one (fork); a finished or prefilled sequence names its full blocks in the prefix cache
                (offer)
    pressure    when the free blocks run out, blocks that only the prefix cache holds are reclaimed first
                (least recently used); the scheduler decides what else gives way (admission waits,
                preemption)
"""

from __future__ import annotations

import torch

from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import BlockPool, BlockTable, PoolExhausted
from scratchlm.serve.prefix_cache import PrefixCache

BLOCK = 16  # tokens per block (vLLM's default)
DEFAULT_KV_CACHE_MB = 1024.0  # the pool's default size (serve --kv-cache-mb)


def blocks_for_bytes(model: TransformerLM, mb: float, block: int = BLOCK) -> int:
    """How many blocks `mb` MiB hold for this model (K and V, all layers)."""
    c = model.config
    size = BlockPool.block_bytes(c.n_layers, c.n_kv_heads, c.head_dim, block, torch.empty((), dtype=model.dtype).element_size())
    return int(mb * (1 << 20)) // size


class KVSpace:
    """Pool + prefix cache + the block-table operations the scheduler needs (see the module docstring)."""

    def __init__(self, model: TransformerLM, blocks: int, prefix_blocks: int = 0, block: int = BLOCK) -> None:
        if blocks < 1:
            raise ValueError(f"the K/V pool needs at least one block of {block} tokens; raise --kv-cache-mb")
        self.pool = BlockPool.for_model(model, blocks + 1, block)  # + the padding sink
        self.prefix = PrefixCache(self.pool, min(prefix_blocks, blocks))
        self.block = block

    @property
    def capacity_tokens(self) -> int:
        return self.pool.capacity * self.block

    @property
    def bytes(self) -> int:
        return (self.pool.k.numel() + self.pool.v.numel()) * self.pool.k.element_size()

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def available(self) -> int:
        """Blocks a sequence could get now: free ones and those only the prefix cache holds."""
        return self.pool.free + self.prefix.reclaimable()

    def take(self, n: int) -> list[int]:
        """n fresh blocks, reclaiming prefix-cache blocks if needed; PoolExhausted when even that is short."""
        if n > self.pool.free:
            self.prefix.reclaim(n - self.pool.free)
        return self.pool.alloc(n)

    def grow(self, table: BlockTable, n: int) -> bool:
        """Make room in `table` for n more tokens; False (and nothing changed) when the pool cannot."""
        need = self.blocks_for(max(0, n - table.room(self.block)))
        if need == 0:
            return True
        try:
            table.blocks += self.take(need)
        except PoolExhausted:
            return False
        return True

    def release(self, table: BlockTable) -> None:
        self.pool.release(table.blocks)
        table.blocks, table.length = [], 0

    def start(self, prompt: list[int] | tuple[int, ...]) -> BlockTable:
        """A table for `prompt` holding its longest cached prefix: the cache's full blocks (shared), then a copy
        of the cached block that shares the most of the prompt's next tokens (its first m slots kept; skipped
        when no block is free for the copy)."""
        blocks, partial = self.prefix.lookup(prompt)
        self.pool.share(blocks)
        table = BlockTable(blocks, len(blocks) * self.block)
        if partial is not None:
            src, m = partial
            self.pool.share([src])  # not reclaimed by take() while it is copied
            try:
                (dst,) = self.take(1)
                self.pool.copy_block(src, dst)
                table.blocks.append(dst)
                table.length += m
                self.prefix.hit_tokens += m
            except PoolExhausted:  # no block for the copy: the prompt prefills those m tokens itself
                pass
            finally:
                self.pool.release([src])
        return table

    def fork(self, table: BlockTable) -> BlockTable:
        """Another sequence continuing `table`'s tokens: its full blocks shared, the partly filled last block
        copied (both continue it differently); PoolExhausted when no block is free for that copy."""
        full = table.length // self.block
        shared = table.blocks[:full]
        self.pool.share(shared)
        out = BlockTable(list(shared), table.length)
        if table.length % self.block:
            try:
                (copy,) = self.take(1)
            except PoolExhausted:
                self.pool.release(shared)
                raise
            self.pool.copy_block(table.blocks[full], copy)
            out.blocks.append(copy)
        return out

    def offer(self, tokens: list[int] | tuple[int, ...], table: BlockTable) -> None:
        """Name the table's full blocks (holding `tokens`) in the prefix cache."""
        self.prefix.store(tokens[: table.length], table.blocks)
