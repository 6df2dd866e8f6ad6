"""The C++ step over block tables (FastDecoder.paged: rows of different lengths in one call, each reading and
writing its own blocks of a BlockPool) == the model's forward of each row alone into a contiguous cache.

Reference: TransformerLM.forward with a KVCache per row (the reference path). The pool's blocks are handed
out shuffled, so a row's tokens sit in non-consecutive blocks, and a neighbour's blocks are interleaved with
them. Tolerances as tests/kernels/test_native_chunk.py's (fp32, a different summation order).
"""

from __future__ import annotations

import random

import pytest
import torch

from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.kernels.build import native
from scratchlm.nn.paged_kv_cache import BlockPool, BlockTable

from test_native_step import VARIANTS, model, on_blocks  # noqa: E402  (tests/kernels is on sys.path under pytest)

pytestmark = pytest.mark.skipif(native() is None, reason="no C++ compiler: the torch step is the only path")
BS = 4  # small blocks: every row spans several


def scattered_tables(pool: BlockPool, lengths: list[int], extra: int) -> list[BlockTable]:
    """One table per row with room for its length + extra tokens, the blocks drawn from a shuffled pool."""
    free = list(range(1, pool.n_blocks))
    random.Random(0).shuffle(free)
    out = []
    for n in lengths:
        k = -(-(n + extra) // BS)
        out.append(BlockTable(free[:k], 0))
        free = free[k:]
    return out


def run(m, quant, prompts: list[list[int]], chunk: int, steps: int) -> None:
    """Prompts (ragged) prefilled through paged() in one call per row, then `chunk` tokens for all rows in one
    call, then `steps` one-token steps for all rows: logits and the blocks' K/V against the forward."""
    dec = FastDecoder(m, quant=quant)
    assert dec.native is not None
    g = torch.Generator().manual_seed(4)
    pool = BlockPool.for_model(m, 64, BS)
    tables = scattered_tables(pool, [len(p) for p in prompts], chunk + steps)
    seqs = [list(p) for p in prompts]
    with torch.no_grad():
        for p, t in zip(prompts, tables):  # ragged prompts, one row each
            dec.paged(torch.tensor([p]), torch.arange(len(p))[None], pool, [t])
        feeds = [torch.randint(0, 96, (len(prompts), chunk), generator=g)]
        feeds += [torch.randint(0, 96, (len(prompts), 1), generator=g) for _ in range(steps)]
        for ids in feeds:  # every row at its own length, one call
            pos = torch.stack([torch.arange(t.length, t.length + ids.shape[1]) for t in tables])
            got = dec.paged(ids, pos, pool, tables)
            for b, s in enumerate(seqs):
                s += ids[b].tolist()
                want = m(torch.tensor([s]))[0, -1]
                torch.testing.assert_close(got[b], want, rtol=2e-5, atol=2e-5)
        for s, t in zip(seqs, tables):
            assert t.length == len(s)
            cache = m.new_kv_cache(1, len(s))
            m(torch.tensor([s]), kv_cache=cache)
            k, v = pool.read(t)  # (L, KvH, n, Hd)
            torch.testing.assert_close(k, cache.k[:, 0], rtol=1e-4, atol=5e-5)
            torch.testing.assert_close(v, cache.v[:, 0], rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_paged_rows_equal_the_forward_fp32(variant: str) -> None:
    """Every native variant (GQA, sliding window 4 < the rows' lengths, RoPE styles, ...), ragged rows."""
    run(model(**VARIANTS[variant]), None, [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [5] * 11], chunk=3, steps=3)


def test_paged_rows_equal_the_forward_on_gguf_blocks() -> None:
    run(on_blocks(model(n_kv_heads=2)), "gguf", [[3, 1, 4, 1, 5], [2, 7], [6, 6, 6, 6, 6, 6, 6, 6, 6]], chunk=2,
        steps=4)


def test_paged_refuses_a_table_without_room_or_a_block_outside_the_pool() -> None:
    m = model(n_kv_heads=2)
    dec = FastDecoder(m)
    pool = BlockPool.for_model(m, 8, BS)
    with pytest.raises(ValueError, match="no room for 2 more tokens"):
        dec.paged(torch.tensor([[1, 2]]), torch.tensor([[0, 1]]), pool, [BlockTable([1], 3)])
    with pytest.raises(RuntimeError, match="outside the pool's 8 blocks"):
        dec.paged(torch.tensor([[1]]), torch.tensor([[0]]), pool, [BlockTable([9], 0)])


def test_all_logits_are_every_tokens_forward_logits() -> None:
    """all_logits (speculative verification): the logits of each of the C tokens of every row, as the forward
    of the row's whole sequence gives them at those positions."""
    m = on_blocks(model(n_kv_heads=2))
    dec = FastDecoder(m, quant="gguf")
    pool = BlockPool.for_model(m, 64, BS)
    prompts = [[3, 1, 4, 1, 5, 9], [2, 7, 1]]
    tables = scattered_tables(pool, [len(p) for p in prompts], 4)
    with torch.no_grad():
        for p, t in zip(prompts, tables):
            dec.paged(torch.tensor([p]), torch.arange(len(p))[None], pool, [t])
        feed = torch.tensor([[2, 6, 5, 3], [8, 2, 8, 1]])
        pos = torch.stack([torch.arange(len(p), len(p) + 4) for p in prompts])
        got = dec.paged(feed, pos, pool, tables, all_logits=True)  # (2, 4, V)
        assert got.shape == (2, 4, m.config.vocab_size) and [t.length for t in tables] == [10, 7]
        for b, p in enumerate(prompts):
            want = m(torch.tensor([p + feed[b].tolist()]))[0, len(p):]
            torch.testing.assert_close(got[b], want, rtol=2e-5, atol=2e-5)
