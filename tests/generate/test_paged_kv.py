"""The paged KV cache (nn/paged_kv_cache.py) against the contiguous one and the full forward.

    - ragged rows (left-padded joint prefill, shared prefix blocks, scattered block ids) then decode steps: every
      row's logits equal its own full forward at every step, on the reference and sdpa attention, GQA/MQA, and
      with sliding windows shorter than the rows
    - a chunk fed to one row while the others wait (chunked prefill) and a chunk split like the bf16 prefill
      (T - 1 inputs, then 1): logits of every position equal the full forward
    - generate's prefill (model and bf16 modes) into a paged view stores the K/V the contiguous cache holds
    - the pool: reference counts, lowest-id reuse, exhaustion, double release
"""

from __future__ import annotations

import random

import pytest
import torch

from gen_helpers import build, small_config, window_config
from scratchlm.generate.prefill import prefill
from scratchlm.nn.paged_kv_cache import BlockPool, BlockTable, PagedKVCache, PoolExhausted

TOL = dict(rtol=1e-5, atol=1e-5)
BS = 4  # small blocks: rows cross many block boundaries


# tiny matmuls: one intra-op thread (tests/conftest.py's fixture)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


CONFIGS = {"gqa": lambda: small_config("llama-gqa-half"), "mqa": lambda: small_config("llama-mqa"),
           "sdpa": lambda: small_config("llama-sdpa"), "window": window_config}


class Scattered:
    """A pool whose blocks are all allocated up front and handed to tables in a shuffled order (tables then point
    all over the pool)."""

    def __init__(self, model, n_blocks: int = 64, seed: int = 0) -> None:
        self.pool = BlockPool.for_model(model, n_blocks, BS)
        self.stack = self.pool.alloc(n_blocks - 1)
        random.Random(seed).shuffle(self.stack)

    def grow(self, table: BlockTable, n: int) -> None:
        """Blocks for n more tokens."""
        while table.room(BS) < n:
            table.blocks.append(self.stack.pop())


def full_logits(model, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([seq]))[0]  # (T, V)


def feed(model, view: PagedKVCache, rows: list[list[int]], keep: int = 1) -> torch.Tensor:
    """One chunk: rows[b] are row b's new tokens (ragged, right-aligned); returns the last `keep` logits (B, keep, V)."""
    t = max(len(r) for r in rows)
    view.expect(t, [len(r) for r in rows])
    ids = torch.tensor([[0] * (t - len(r)) + r for r in rows])
    positions = torch.tensor([[0] * (t - len(r)) + list(range(table.length, table.length + len(r)))
                              for r, table in zip(rows, view.tables)])
    with torch.no_grad():
        return model(ids, positions, view.key_mask(), view, logits_to_keep=keep)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ragged_rows_prefill_then_decode_equal_the_full_forward(name):
    model = build(CONFIGS[name](), scale=2.0)
    space = Scattered(model)
    pool, grow = space.pool, space.grow
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (11, 1, 6)]
    tables = [BlockTable() for _ in prompts]
    for p, table in zip(prompts, tables):
        grow(table, len(p))
    view = PagedKVCache(pool, tables)
    logits = feed(model, view, prompts)[:, -1]  # joint left-padded prefill
    seqs = [list(p) for p in prompts]
    for step in range(9):
        for b, seq in enumerate(seqs):
            torch.testing.assert_close(logits[b], full_logits(model, seq)[-1], **TOL)
            seq.append(int(logits[b].argmax()))
        for table in tables:
            grow(table, 1)
        logits = feed(model, PagedKVCache(pool, tables), [[s[-1]] for s in seqs])[:, -1]
    assert [t.length for t in tables] == [len(s) for s in seqs]  # every chosen token was fed


@pytest.mark.parametrize("name", ["gqa", "window"])
def test_chunks_and_shared_prefix_blocks(name):
    """Row 1 shares row 0's first two full blocks (a common prefix) and continues on its own blocks; a chunk for
    one row while the other waits (real 0), and a chunk fed as T - 1 inputs then 1, give the full forward's
    logits at every position."""
    model = build(CONFIGS[name](), scale=2.0)
    space = Scattered(model, seed=2)
    pool, grow = space.pool, space.grow
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 128, (2 * BS,), generator=g).tolist()
    a = BlockTable()
    grow(a, len(prefix))
    feed(model, PagedKVCache(pool, [a]), [prefix])
    b = BlockTable(list(a.blocks), a.length)
    pool.share(b.blocks)
    tail_a, tail_b = torch.randint(0, 128, (7,), generator=g).tolist(), torch.randint(0, 128, (3,), generator=g).tolist()
    grow(a, 7)
    grow(b, 3)
    out = feed(model, PagedKVCache(pool, [a, b]), [tail_a, []], keep=7)  # row 1: nothing this chunk
    torch.testing.assert_close(out[0], full_logits(model, prefix + tail_a)[-7:], **TOL)
    assert (a.length, b.length) == (2 * BS + 7, 2 * BS)
    view = PagedKVCache(pool, [a, b]).expect(3, [1, 3])
    ids = torch.tensor([[0, 0, 5], tail_b])
    positions = torch.tensor([[0, 0, a.length], list(range(b.length, b.length + 3))])
    mask = view.key_mask()
    with torch.no_grad():  # the bf16 prefill's split: T - 1 inputs, then the last one
        model(ids[:, :-1], positions[:, :-1], mask[:, :-1], view)
        last = model(ids[:, -1:], positions[:, -1:], mask, view)[:, -1]
    torch.testing.assert_close(last[0], full_logits(model, prefix + tail_a + [5])[-1], **TOL)
    torch.testing.assert_close(last[1], full_logits(model, prefix + tail_b)[-1], **TOL)
    assert pool.refs[a.blocks[0]] == 2 and pool.refs[a.blocks[-1]] == 1


@pytest.mark.parametrize("mode", ["model", "bf16"])
def test_generate_prefill_stores_what_the_contiguous_cache_holds(mode):
    model = build(small_config("llama-gqa-half"), scale=2.0)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(10)[None].expand(2, -1)
    cache = model.new_kv_cache(2, max_seq_len=10)
    space = Scattered(model, seed=5)
    pool, grow = space.pool, space.grow
    tables = [BlockTable(), BlockTable()]
    for t in tables:
        grow(t, 10)
    view = PagedKVCache(pool, tables).expect(10)
    with torch.no_grad():
        want = prefill(model, ids, positions, None, cache, mode)
        got = prefill(model, ids, positions, None, view, mode)
    torch.testing.assert_close(got, want, **TOL)
    for row, table in enumerate(tables):
        k, v = pool.read(table)  # (L, KvH, n, Hd)
        torch.testing.assert_close(k, cache.k[:, row], **TOL)
        torch.testing.assert_close(v, cache.v[:, row], **TOL)


def test_pool_counts_references_and_reuses_low_blocks_first():
    pool = BlockPool(1, 1, 2, n_blocks=6, block_size=2)
    assert pool.capacity == 5 and pool.alloc(3) == [1, 2, 3]
    pool.share([2])
    pool.release([1, 2])
    assert pool.free == 3 and pool.refs[2] == 1  # still used by its other holder
    assert pool.alloc(2) == [1, 4]  # the lowest free ids first
    with pytest.raises(PoolExhausted):
        pool.alloc(2)
    pool.release([2, 3])
    with pytest.raises(ValueError, match="already free"):
        pool.release([3])
    with pytest.raises(ValueError, match="is free"):
        pool.share([3])
    assert pool.high_water == 4 and torch.count_nonzero(pool.k[:, 0]) == 0  # block 0: the zeroed sink
