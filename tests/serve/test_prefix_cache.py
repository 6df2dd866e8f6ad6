"""Prefix caching: blocks keyed by their exact token prefix, LRU-bounded; requests that share a prefix (a
system prompt, earlier turns, an earlier reply) reuse its K/V, and their greedy and seeded outputs stay
exactly the engine's outputs for each prompt alone."""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM
from scratchlm.serve.joining import prefill_prompts
from scratchlm.serve.prefix_cache import PrefixCache
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.sequence import Sequence
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

from serve_helpers import client
from tiny_checkpoint import MODEL

CONTEXT, BLOCK = 128, 8


def kv(n: int, seed: int = 0):
    k = torch.randn(2, 1, n, 4, generator=torch.Generator().manual_seed(seed))  # (L, KvH, n, Hd)
    return lambda a, b: (k[:, :, a:b], -k[:, :, a:b]), k


def test_match_store_and_lru_eviction():
    block_bytes = 2 * 2 * 1 * BLOCK * 4 * 4
    cache = PrefixCache(BLOCK, capacity_bytes=4 * block_bytes)
    tokens = list(range(30))
    slices, k = kv(30)
    assert cache.store(tokens, slices) == 3  # 3 full blocks of 8; the last 6 tokens are not cached
    chain = cache.match(tokens[:20] + [99])
    assert len(chain) == 2 and torch.equal(chain[1].k, k[:, :, 8:16]) and torch.equal(chain[1].v, -k[:, :, 8:16])
    assert len(cache.match(tokens[:24])) == 2  # the last token is never taken from the cache
    assert len(cache.match(tokens[:25])) == 3 and cache.match([5] + tokens) == []
    other = [100 + t for t in range(16)]
    cache.store(other, kv(16, 1)[0])  # 5 blocks > capacity 4: the least recently used goes
    assert len(cache.blocks) == 4 and cache.bytes == 4 * block_bytes
    assert len(cache.match(tokens + [0])) == 2 and len(cache.match(other + [0])) == 2
    assert PrefixCache(BLOCK, 0).store(tokens, slices) == 0  # capacity 0: off


def setup(cache_bytes: int, decode: str = "model"):
    torch.manual_seed(0)
    model = TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=2, max_seq_len=CONTEXT,
                                     init_std=0.5)).eval()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    cache = PrefixCache(BLOCK, cache_bytes)
    return model, tok, Scheduler(model, max_batch=4, decode=decode, prefix_cache=cache)


def run(sched: Scheduler, tok, jobs: list[tuple[list[int], int, SamplingParams, int | None]]) -> list[Sequence]:
    seqs = [Sequence.create(0, p, m, params, lambda e: None, tokenizer=tok, vocab_size=259, seed=seed)
            for p, m, params, seed in jobs]
    sched.submit(seqs)
    while sched.rows or sched.waiting:
        sched.step()
    return seqs


@pytest.mark.parametrize("decode", ["model", "fast"])
def test_shared_system_prompt_and_later_turns_reuse_kv(decode):
    model, tok, sched = setup(1 << 20, decode)
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
    assert [s.cached_tokens for s in later] == [40, 40, (45 + 5 + 19) // BLOCK * BLOCK]  # the reply was cached too
    assert sched.stats.cached_prompt_tokens == 40 + 40 + 64


def test_cached_prefill_logits_equal_a_full_prefill():
    model, _, _ = setup(0)
    cache = PrefixCache(BLOCK, 1 << 20)
    prompt = tuple(torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(4)).tolist())
    full = prefill_prompts(model, [prompt], {}, cache, 0, torch.device("cpu"))[0]
    again = prefill_prompts(model, [prompt], {}, cache, 0, torch.device("cpu"))[0]
    assert full.cached == 0 and again.cached == 32
    torch.testing.assert_close(again.logits, full.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again.cache.k, full.cache.k, rtol=1e-5, atol=1e-5)


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
