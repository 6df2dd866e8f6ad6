"""Paged K/V memory: fixed-size blocks from one pool, a block table per sequence (vLLM's PagedAttention layout).

    BlockPool      K and V of N blocks of `block_size` tokens, per layer: (L, N, bs, KvH, Hd) each. Blocks are
                   reference counted, so sequences that share a prefix share its blocks (alloc / share /
                   release); freed blocks are reused lowest id first, which keeps the touched part of the pool
                   (and the process's resident memory) as small as the traffic. Block 0 is never handed out: a
                   zeroed sink where padding tokens' K/V land.
    BlockTable     one sequence's blocks and how many tokens they hold: token p lives in block blocks[p // bs]
                   at row p % bs.
    PagedKVCache   a KVCache view of several sequences' block tables for one forward pass (the model's
                   reference path). Row b holds len_b tokens already and receives r_b new ones in a chunk of T
                   inputs, its r_b real inputs right-aligned (the first T - r_b are padding: computed, not
                   stored). The attention sees every row right-aligned to the chunk's end S = max_b(len_b + r_b):
                       virtual slot  S - len_b - r_b + p   holds the row's token p,  slots before it are padding
                   (key_mask() says which), and the chunk's inputs sit at slots [S - T, S). A row's tokens stay
                   consecutive, so slot distance is position distance (causal and sliding-window masks work as
                   on the contiguous cache). update() stores the new K/V in the rows' blocks and returns the
                   gathered (B, KvH, S', Hd), cast to the caller's dtype (a bf16 copy of the model attends in
                   bf16 over the fp32 pool, as generate/prefill.py's bf16 prefill does over a bf16 scratch).
                   A chunk may be fed in several forwards (prefill's bf16 split: T - 1 inputs, then 1).
Memory per token (all layers, K and V): 2 L KvH Hd bytes_per_element, as the contiguous KVCache.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from scratchlm.nn.kv_cache import KVCache


class PoolExhausted(RuntimeError):
    """Not enough free blocks."""


@dataclass
class BlockTable:
    """A sequence's blocks, in token order, and the number of tokens stored in them."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0

    def room(self, block_size: int) -> int:
        """Tokens that fit the allocated blocks beyond `length`."""
        return len(self.blocks) * block_size - self.length


class BlockPool:
    """Reference-counted blocks of K/V (see the module docstring)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        if n_blocks < 2:
            raise ValueError(f"a block pool needs at least 2 blocks (block 0 is the padding sink), got {n_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        shape = (n_layers, n_blocks, block_size, n_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)  # (L, N, bs, KvH, Hd): pages touched on first use
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.k[:, 0] = 0
        self.v[:, 0] = 0
        self.block_size, self.n_blocks = block_size, n_blocks
        self.refs = [0] * n_blocks
        self._free = list(range(1, n_blocks))  # a min-heap: lowest ids first
        self.high_water = 0  # the most blocks in use at once

    @classmethod
    def for_model(cls, model: torch.nn.Module, n_blocks: int, block_size: int = 16) -> "BlockPool":
        c = model.config
        return cls(c.n_layers, c.n_kv_heads, c.head_dim, n_blocks, block_size, model.dtype, model.device)

    @staticmethod
    def block_bytes(n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, element_size: int = 4) -> int:
        """Bytes of one block (K and V, all layers)."""
        return 2 * n_layers * block_size * n_kv_heads * head_dim * element_size

    @property
    def capacity(self) -> int:
        """Blocks that can be handed out (all but the sink)."""
        return self.n_blocks - 1

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.capacity - self.free

    def alloc(self, n: int) -> list[int]:
        """n fresh blocks (reference count 1 each); PoolExhausted when fewer are free."""
        if n > len(self._free):
            raise PoolExhausted(f"{n} blocks wanted, {len(self._free)} free of {self.capacity}")
        out = [heapq.heappop(self._free) for _ in range(n)]
        for b in out:
            self.refs[b] = 1
        self.high_water = max(self.high_water, self.used)
        return out

    def share(self, blocks: list[int]) -> None:
        """One more reference to each block (another sequence or the prefix cache uses it)."""
        for b in blocks:
            if self.refs[b] < 1:
                raise ValueError(f"block {b} is free; only a block in use can be shared")
            self.refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; a block nobody references is free again."""
        for b in blocks:
            if self.refs[b] < 1:
                raise ValueError(f"block {b} is already free")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                heapq.heappush(self._free, b)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block src's K/V into block dst (copy-on-write of a shared, partly filled last block)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def slots(self, table: BlockTable, start: int, end: int) -> torch.Tensor:
        """Flat slot ids (block * bs + row) of the table's tokens [start, end): (end - start,) int64."""
        p = torch.arange(start, end)
        blocks = torch.tensor(table.blocks, dtype=torch.long)[p // self.block_size]
        return (blocks * self.block_size + p % self.block_size).to(self.k.device)

    def flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v viewed as (L, N bs, KvH, Hd): one row per token slot."""
        l, n, bs, kvh, hd = self.k.shape
        return self.k.view(l, n * bs, kvh, hd), self.v.view(l, n * bs, kvh, hd)

    def read(self, table: BlockTable, start: int = 0, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of the table's tokens [start, end) (default: all): (L, KvH, n, Hd) each, copies."""
        idx = self.slots(table, start, table.length if end is None else end)
        k, v = self.flat()
        return k[:, idx].transpose(1, 2), v[:, idx].transpose(1, 2)

    def write_slots(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (L, n, KvH, Hd) at the flat slots (n,) (one token each, e.g. a decode step's new K/V)."""
        fk, fv = self.flat()
        fk.index_copy_(1, slots, k.to(fk.dtype))  # (L, n, KvH, Hd) into slots along dim 1
        fv.index_copy_(1, slots, v.to(fv.dtype))

    def write(self, table: BlockTable, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (L, KvH, n, Hd) as the table's tokens [start, start + n) (the blocks must be allocated)."""
        idx = self.slots(table, start, start + k.shape[2])
        fk, fv = self.flat()
        fk[:, idx] = k.transpose(1, 2).to(fk.dtype)
        fv[:, idx] = v.transpose(1, 2).to(fv.dtype)


class PagedKVCache(KVCache):
    """The rows' block tables as the model's KV cache for one chunk of inputs (see the module docstring)."""

    def __init__(self, pool: BlockPool, tables: list[BlockTable]) -> None:  # nothing allocated: no super().__init__
        self.pool, self.tables = pool, tables
        self.batch_size = len(tables)
        self._chunk: tuple[int, list[int]] | None = None  # (T inputs, r_b real ones per row) being fed
        self._start: list[int] = []  # the rows' lengths when the chunk was announced
        self._consumed = 0
        self._plan: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (t, write slots, read slots)

    @property
    def end(self) -> int:
        """S: the chunk's end slot (every row right-aligned to it)."""
        if self._chunk is None:
            return max((t.length for t in self.tables), default=0)
        return max(n + r for n, r in zip(self._start, self._chunk[1]))

    @property
    def seq_len(self) -> int:
        """The slot the next forward's first input takes (the model's `start`)."""
        if self._chunk is None:
            return self.end
        return self.end - self._chunk[0] + self._consumed

    @property
    def max_seq_len(self) -> int:
        return self.end + min((t.room(self.pool.block_size) for t in self.tables), default=0)

    def expect(self, t: int, real: list[int] | None = None) -> "PagedKVCache":
        """Announce a chunk of t inputs per row, real[b] of them real (right-aligned; default all t); the rows'
        blocks must have room for them. Returns self."""
        real = [t] * self.batch_size if real is None else list(real)
        if len(real) != self.batch_size or any(not 0 <= r <= t for r in real):
            raise ValueError(f"real counts must be {self.batch_size} values in [0, {t}], got {real}")
        for table, r in zip(self.tables, real):
            if table.room(self.pool.block_size) < r:
                raise ValueError(f"a block table with {table.room(self.pool.block_size)} free slots cannot take {r} "
                                 "more tokens; allocate blocks first")
        self._chunk, self._consumed, self._plan = (t, real), 0, None
        self._start = [table.length for table in self.tables]
        return self

    def key_mask(self) -> torch.Tensor:
        """(B, S) bool over the chunk's whole key span: True on each row's own tokens (stored and new)."""
        s = self.end
        if self._chunk is None:
            first = torch.tensor([s - table.length for table in self.tables])
        else:
            first = torch.tensor([s - n - r for n, r in zip(self._start, self._chunk[1])])
        return (torch.arange(s)[None, :] >= first[:, None]).to(self.pool.k.device)

    def _slot_of(self, blocks: torch.Tensor, p: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Flat slot of token position p (B, n) of each row's blocks (B, nb); the sink (0) where not valid."""
        bs = self.pool.block_size
        pc = torch.where(valid, p, 0)
        slot = blocks.gather(1, (pc // bs).clamp(max=blocks.shape[1] - 1)) * bs + pc % bs
        return torch.where(valid, slot, 0)

    def _make_plan(self, t: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Slots to write this forward's t inputs to, and to read the key span [0, seq_len + t) from."""
        if self._chunk is None:
            self.expect(t)
        total, real = self._chunk
        if self._consumed + t > total:
            raise ValueError(f"a forward of {t} inputs overruns the announced chunk ({total - self._consumed} left)")
        width = max(1, max(len(table.blocks) for table in self.tables))
        blocks = torch.zeros(self.batch_size, width, dtype=torch.long)
        for i, table in enumerate(self.tables):
            blocks[i, : len(table.blocks)] = torch.tensor(table.blocks, dtype=torch.long)
        n, r = torch.tensor(self._start), torch.tensor(real)
        pads = total - r  # (B,)
        inputs = torch.arange(self._consumed, self._consumed + t)[None, :]  # (1, t)
        write = self._slot_of(blocks, n[:, None] + inputs - pads[:, None], inputs >= pads[:, None])  # (B, t)
        span = self.seq_len + t
        p = torch.arange(span)[None, :] - (self.end - n - r)[:, None]  # (B, span): token position of each slot
        stored = n + (self._consumed + t - pads).clamp(min=0)  # tokens readable once this forward wrote
        read = self._slot_of(blocks, p, (p >= 0) & (p < stored[:, None]))
        dev = self.pool.k.device
        return t, write.flatten().to(dev), read.to(dev)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, KvH, t, Hd) in the rows' blocks; return the key span (B, KvH, seq_len + t, Hd)."""
        b, kvh, t, hd = k.shape
        if self._plan is None or self._plan[0] != t:
            self._plan = self._make_plan(t)
        _, write, read = self._plan
        fk, fv = self.pool.flat()
        keys, values = fk[layer_idx], fv[layer_idx]  # (N bs, KvH, Hd) views of this layer
        keys.index_copy_(0, write, k.transpose(1, 2).reshape(b * t, kvh, hd).to(keys.dtype))
        values.index_copy_(0, write, v.transpose(1, 2).reshape(b * t, kvh, hd).to(values.dtype))
        span = read.shape[1]
        out_k = keys.index_select(0, read.flatten()).view(b, span, kvh, hd).transpose(1, 2)  # (B, KvH, S', Hd)
        out_v = values.index_select(0, read.flatten()).view(b, span, kvh, hd).transpose(1, 2)
        return out_k.to(k.dtype), out_v.to(v.dtype)

    def advance(self, n: int) -> None:
        """The forward of n inputs is done: its real tokens count as stored."""
        if self._chunk is None:
            raise ValueError("advance() without a forward")
        total, real = self._chunk
        self._consumed += n
        for table, start, r in zip(self.tables, self._start, real):
            table.length = start + max(0, self._consumed - (total - r))
        self._plan = None
        if self._consumed == total:
            self._chunk, self._consumed = None, 0

    def reset(self) -> None:
        raise ValueError("a paged view does not own its blocks; release them through the BlockPool")
