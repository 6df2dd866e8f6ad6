"""Prefix caching as block sharing: full pool blocks named by their exact token prefix, LRU-bounded; requests that
share a prefix (a system prompt, earlier turns, an earlier reply) take the same blocks into their block tables,
running sequences included, and their greedy and seeded outputs stay exactly the engine's outputs for each
prompt alone."""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import BlockPool
from scratchlm.serve.joining import Joiner, prefill_step
from scratchlm.serve.kv_space import BLOCK, KVSpace
from scratchlm.serve.prefix_cache import PrefixCache
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.sequence import Sequence
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

from serve_helpers import client
from tiny_checkpoint import MODEL

CONTEXT = 128


def test_match_store_lru_and_reclaim():
    pool = BlockPool(1, 1, 2, n_blocks=12, block_size=4)
    cache = PrefixCache(pool, capacity_blocks=4)
    tokens = list(range(14))
    blocks = pool.alloc(4)  # a sequence's table: 14 tokens in 4 blocks (the last one partial)
    assert cache.store(tokens, blocks) == 3  # 3 full blocks; the last 2 tokens are not named
    assert [pool.refs[b] for b in blocks] == [2, 2, 2, 1]  # the cache holds its own reference
    assert cache.match(tokens[:9] + [99]) == blocks[:2]
    assert cache.match(tokens[:12]) == blocks[:2]  # the last token is never taken from the cache
    assert cache.match(tokens[:13]) == blocks[:3] and cache.match([5] + tokens) == []
    pool.release(blocks)  # the sequence ends: the named blocks live on in the cache
    assert pool.free == 12 - 1 - 3
    other = [100 + t for t in range(8)]
    cache.store(other, pool.alloc(2))  # 5 named > capacity 4: the least recently used goes (a child first)
    assert len(cache.entries) == 4 and cache.match(tokens + [0]) == blocks[:2]
    assert cache.reclaimable() == 2  # the 2 old ones only the cache holds (the new ones are still in use)
    assert cache.reclaim(5) == 2 and cache.match(tokens + [0]) == []
    assert PrefixCache(pool, 0).store(other, [1, 2]) == 0  # capacity 0: off


def test_lookup_takes_the_cached_block_sharing_the_most_next_tokens():
    pool = BlockPool(1, 1, 2, n_blocks=12, block_size=4)
    cache = PrefixCache(pool, capacity_blocks=8)
    a, b = pool.alloc(3), pool.alloc(3)
    cache.store([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], a)
    cache.store([1, 2, 3, 4, 5, 6, 0, 0, 9], b)  # same first block; its second block shares 2 leading tokens
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 0, 0, 0]) == ([a[0]], (a[1], 3))  # 5 6 7 beats 5 6
    assert cache.lookup([1, 2, 3, 4, 5, 6, 0, 0]) == ([a[0]], (b[1], 3))  # the last token is never taken
    assert cache.lookup([1, 2, 3, 4, 5, 6]) == ([a[0]], (a[1], 1))
    assert cache.lookup([1, 2, 3, 4, 9, 9]) == ([a[0]], None) and cache.lookup([1, 2, 9]) == ([], (a[0], 2))
    assert cache.lookup([1, 2, 3, 4, 5]) == ([a[0]], None)  # nothing left to take after the full block
    cache.clear()
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8]) == ([], None) and cache.children == {}


def test_a_partly_matching_block_is_copied_and_its_prefill_equals_a_full_one():
    """A prompt sharing 16 + 7 tokens with a cached one: one shared block, a copy of the next one with 7 slots
    kept; the rest prefilled. Logits and stored K/V equal a prefill of the whole prompt without the cache, and
    the cached block itself is untouched."""
    model, tok, _ = setup(0)
    space = KVSpace(model, 32, prefix_blocks=32)
    g = torch.Generator().manual_seed(6)
    first = torch.randint(0, 256, (40,), generator=g).tolist()
    second = first[:23] + torch.randint(0, 256, (9,), generator=g).tolist()

    def prefill_once(space, prompt):
        table = space.start(prompt)
        assert space.grow(table, len(prompt) - table.length)
        j = Joiner(list(prompt), [], table, cached=table.length)
        prefill_step(model, space, [j], 1000, "model")
        space.offer(prompt, table)
        return j

    a = prefill_once(space, first)
    cached_block = space.pool.read(type(a.table)(a.table.blocks[1:2], 16))
    b = prefill_once(space, second)
    assert b.cached == 23 and b.table.blocks[0] == a.table.blocks[0] and b.table.blocks[1] != a.table.blocks[1]
    for x, y in zip(space.pool.read(type(a.table)(a.table.blocks[1:2], 16)), cached_block):
        assert torch.equal(x, y)
    fresh = prefill_once(KVSpace(model, 32, prefix_blocks=0), second)  # no cache: the whole prompt
    torch.testing.assert_close(b.logits, fresh.logits, rtol=1e-5, atol=1e-5)
    for x, y in zip(space.pool.read(b.table), fresh_kv(model, second)):  # (L, KvH, 32, Hd) each
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def fresh_kv(model, prompt):
    cache = model.new_kv_cache(1, max_seq_len=len(prompt))
    with torch.no_grad():
        model(torch.tensor([prompt]), kv_cache=cache)
    return cache.k[:, 0], cache.v[:, 0]


def setup(prefix_blocks: int, decode: str = "model", kv_blocks: int | None = None):
    torch.manual_seed(0)
    model = TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=2, max_seq_len=CONTEXT,
                                     init_std=0.5)).eval()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    return model, tok, Scheduler(model, max_batch=4, decode=decode, prefix_blocks=prefix_blocks, kv_blocks=kv_blocks)


def make(tok, prompt, max_tokens, params=SamplingParams(), seed=None) -> Sequence:
    return Sequence.create(0, prompt, max_tokens, params, lambda e: None, tokenizer=tok, vocab_size=259, seed=seed)


def run(sched: Scheduler, tok, jobs: list[tuple[list[int], int, SamplingParams, int | None]]) -> list[Sequence]:
    seqs = [make(tok, p, m, params, seed) for p, m, params, seed in jobs]
    sched.submit(seqs)
    while sched.rows or sched.waiting or sched.joiners:
        sched.step()
    return seqs


@pytest.mark.parametrize("decode", ["model", "fast"])
def test_shared_system_prompt_and_later_turns_reuse_kv(decode):
    model, tok, sched = setup(64, decode)
    g = torch.Generator().manual_seed(3)
    system = torch.randint(0, 256, (45,), generator=g).tolist()
    users = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 9, 3)]
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95)
    first = run(sched, tok, [(system + users[0], 20, greedy, None)])[0]
    assert sched.stats.cached_prompt_tokens == 0
    later = run(sched, tok, [(system + users[1], 20, greedy, None), (system + users[2], 20, sampled, 7),
                             (system + users[0] + first.tokens + users[1], 12, greedy, None)])
    for s, (_, m, params, seed) in zip([first] + later, [(0, 20, greedy, None), (0, 20, greedy, None),
                                                         (0, 20, sampled, 7), (0, 12, greedy, None)]):
        kw = {} if params.greedy else {"temperature": 0.9, "top_p": 0.95, "seed": seed}
        assert s.tokens == generate(model, [s.prompt], m, **kw)[0]
    # the system prompt's 45 tokens: 2 full blocks and 13 slots of the first prompt's third block (copied);
    # the third request continues the first one's reply, cached in full blocks up to 64 tokens
    assert [s.cached_tokens for s in later] == [45, 45, (45 + 5 + 19) // BLOCK * BLOCK]
    assert sched.stats.cached_prompt_tokens == 45 + 45 + 64
    assert sched.space.pool.used == len(sched.space.prefix.entries)  # what is left in use: the cache's blocks


def test_running_sequences_share_their_common_prefix_blocks():
    """Two requests with one 40-token system prompt, the second admitted while the first runs: the second's
    table starts with the first's two full blocks (shared, not copied) while both decode."""
    model, tok, sched = setup(64)
    g = torch.Generator().manual_seed(5)
    system = torch.randint(0, 256, (40,), generator=g).tolist()
    a, b = make(tok, system + [1, 2], 30), make(tok, system + [3], 30)
    sched.submit([a])
    sched.step()
    sched.submit([b])
    sched.step()
    assert a.kv.blocks[:2] == b.kv.blocks[:2] and a.kv.blocks[2] != b.kv.blocks[2]
    assert [sched.space.pool.refs[x] for x in a.kv.blocks[:2]] == [3, 3]  # a, b and the prefix cache
    assert b.cached_tokens == 32
    while sched.rows:
        sched.step()
    for s in (a, b):
        assert s.tokens == generate(model, [s.prompt], 30)[0]


def test_cached_prefill_logits_equal_a_full_prefill():
    model, tok, _ = setup(0)
    space = KVSpace(model, 32, prefix_blocks=32)
    prompt = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(4)).tolist()

    def prefill_once():
        table = space.start(prompt)
        assert space.grow(table, len(prompt) - table.length)
        j = Joiner(list(prompt), [], table, cached=table.length)
        prefill_step(model, space, [j], 1000, "model")
        return j

    full, again = prefill_once(), prefill_once()
    assert full.cached == 0 and again.cached == 32 and again.table.blocks[:2] == full.table.blocks[:2]
    torch.testing.assert_close(again.logits, full.logits, rtol=1e-5, atol=1e-5)
    for x, y in zip(space.pool.read(again.table), space.pool.read(full.table)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_server_reports_cached_tokens(server, reference):
    _, tok = reference
    system = "You are the ghost of Hamlet's father. " * 6
    c = client(server)
    kw = dict(model=MODEL, max_tokens=8, temperature=0)
    a = c.chat.completions.create(messages=[{"role": "system", "content": system}, {"role": "user", "content": "Who?"}],
                                  **kw)
    b = c.chat.completions.create(messages=[{"role": "system", "content": system}, {"role": "user", "content": "Why?"}],
                                  **kw)
    assert b.usage.prompt_tokens_details.cached_tokens >= len(tok.encode(system)) - 16 > 0
    assert a.usage.prompt_tokens_details.cached_tokens <= b.usage.prompt_tokens_details.cached_tokens
    chunks = list(c.chat.completions.create(messages=[{"role": "system", "content": system},
                                                      {"role": "user", "content": "Where?"}], stream=True,
                                            stream_options={"include_usage": True}, **kw))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= len(tok.encode(system)) - 16
