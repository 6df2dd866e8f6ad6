"""The C++ chunk (several prompt tokens per row in one call, generate/fast_decode.py FastDecoder.chunk) == the
model's forward of the same tokens into the same cache, and prefill() routes short prompts through it.

Reference: TransformerLM.forward with a KV cache (the reference path, logits_to_keep=1) from one cache state;
the chunk runs from a copy. Logits and every written cache slot agree to fp32 rounding (the C++ kernels sum in
a different order than torch's GEMMs, tolerances as tests/kernels/test_native_step.py's).
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.generate.prefill import CHUNK_MAX_ROWS, PROMPT_CHUNK_MAX_ROWS, prefill
from scratchlm.kernels.build import native

from scratchlm.quant.quantize import quantize_blocks
from test_native_step import VARIANTS, model, on_blocks  # noqa: E402  (tests/kernels is on sys.path under pytest)

pytestmark = pytest.mark.skipif(native() is None, reason="no C++ compiler: the torch step is the only path")


def copy_cache(m, cache, b):
    twin = m.new_kv_cache(b, cache.max_seq_len)
    twin.k.copy_(cache.k), twin.v.copy_(cache.v)
    twin.seq_len = cache.seq_len
    return twin


def check(m, quant, prefix: int, c: int, b: int = 1) -> None:
    dec = FastDecoder(m, quant=quant)
    assert dec.native is not None
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 96, (b, prefix + c), generator=g)
    want_cache = m.new_kv_cache(b, 24)
    with torch.no_grad():
        if prefix:
            m(ids[:, :prefix], kv_cache=want_cache)
        got_cache = copy_cache(m, want_cache, b)
        pos = torch.arange(prefix, prefix + c).expand(b, c)
        want = m(ids[:, prefix:], pos, None, want_cache, logits_to_keep=1)[:, -1]
        got = dec.chunk(ids[:, prefix:], pos, None, got_cache)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    end = prefix + c
    assert got_cache.seq_len == want_cache.seq_len == end
    torch.testing.assert_close(got_cache.k[..., :end, :], want_cache.k[..., :end, :], rtol=1e-4, atol=5e-5)
    torch.testing.assert_close(got_cache.v[..., :end, :], want_cache.v[..., :end, :], rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chunk_equals_forward_fp32(variant: str) -> None:
    check(model(**VARIANTS[variant]), None, prefix=5, c=7)  # the sliding variant's window (4) < the chunk


@pytest.mark.parametrize("prefix, c, b", [(0, 9, 1), (6, 1, 1), (3, 5, 2)])
def test_chunk_equals_forward_on_gguf_blocks(prefix: int, c: int, b: int) -> None:
    check(on_blocks(model(n_kv_heads=2)), "gguf", prefix, c, b)


def test_prefill_routes_short_prompts_through_the_chunk_with_left_padding(monkeypatch) -> None:
    """prefill(decoder=...) of a left-padded batch (the engine's key mask) equals the forward on the real
    rows' logits and real cache slots; a prompt past CHUNK_MAX_ROWS tokens takes the forward."""
    m = on_blocks(model(n_kv_heads=2))
    dec = FastDecoder(m, quant="gguf")
    calls = []
    chunk = dec.chunk
    dec.chunk = lambda *a: calls.append(a[0].shape) or chunk(*a)
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False  # row 0: 5 real tokens, left-padded by 3
    pos = (torch.cumsum(mask, 1) - 1).clamp(min=0)
    caches = [m.new_kv_cache(2, 16), m.new_kv_cache(2, 16)]
    with torch.no_grad():
        want = prefill(m, ids, pos, mask, caches[0])
        got = prefill(m, ids, pos, mask, caches[1], decoder=dec)
    assert calls == [(2, 8)]
    assert torch.isfinite(got).all() and torch.isfinite(caches[1].k).all()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    for row, first in ((0, 3), (1, 0)):
        torch.testing.assert_close(caches[1].k[:, row, :, first:8], caches[0].k[:, row, :, first:8], rtol=1e-4,
                                   atol=5e-5)
    assert PROMPT_CHUNK_MAX_ROWS >= CHUNK_MAX_ROWS >= 16
    # the model's context is 48 tokens: smaller limits. Every matrix in blocks: the blocks' limit applies
    assert dec.prompt_gemm
    monkeypatch.setattr("scratchlm.generate.prefill.CHUNK_MAX_ROWS", 4)
    monkeypatch.setattr("scratchlm.generate.prefill.PROMPT_CHUNK_MAX_ROWS", 8)
    with torch.no_grad():
        prefill(m, ids[:1, :4], torch.arange(4)[None], None, m.new_kv_cache(1, 16), decoder=dec)
    assert calls == [(2, 8), (1, 4)]
    # a dense decoder (fp32 matrices: the GEMV's passes in C++) keeps CHUNK_MAX_ROWS
    dm = model(n_kv_heads=2)
    dense = FastDecoder(dm)
    assert not dense.prompt_gemm and dense.native is not None
    dense_calls = []
    dense_chunk = dense.chunk
    dense.chunk = lambda *a: dense_calls.append(a[0].shape) or dense_chunk(*a)
    with torch.no_grad():
        for p in (4, 6):
            prefill(dm, ids[:1, :p], torch.arange(p)[None], None, dm.new_kv_cache(1, 16), decoder=dense)
    assert dense_calls == [(1, 4)]


def test_prefill_runs_a_long_prompt_on_blocks_through_the_chunk_in_pieces(monkeypatch) -> None:
    """Past PROMPT_CHUNK_MAX_ROWS tokens over all rows, a decoder on blocks takes the prompt in pieces of
    PROMPT_CHUNK_MAX_ROWS // B tokens per row, each attending to the cache the pieces before it filled: logits
    and every real cache slot equal the forward's (reference path), for a left-padded batch whose first piece
    of row 0 is mostly padding, on top of cached tokens. A dense decoder and a longrope prompt that crosses its
    switch keep the forward."""
    monkeypatch.setattr("scratchlm.generate.prefill.CHUNK_MAX_ROWS", 4)
    monkeypatch.setattr("scratchlm.generate.prefill.PROMPT_CHUNK_MAX_ROWS", 8)
    m = on_blocks(model(n_kv_heads=2))
    dec = FastDecoder(m, quant="gguf")
    calls = []
    chunk = dec.chunk
    dec.chunk = lambda *a: calls.append(tuple(a[0].shape)) or chunk(*a)
    g = torch.Generator().manual_seed(5)
    prefix, ids = torch.randint(0, 96, (2, 3), generator=g), torch.randint(0, 96, (2, 11), generator=g)
    mask = torch.ones(2, 14, dtype=torch.bool)
    mask[0, :6] = False  # row 0: its 3 cached tokens and the prompt's first 3 are padding
    pos = (torch.cumsum(mask, 1) - 1).clamp(min=0)
    caches = [m.new_kv_cache(2, 16), m.new_kv_cache(2, 16)]
    with torch.no_grad():
        for c in caches:
            m(prefix, pos[:, :3], mask[:, :3], c)
        want = prefill(m, ids, pos[:, 3:], mask, caches[0])
        got = prefill(m, ids, pos[:, 3:], mask, caches[1], decoder=dec)
    assert calls == [(2, 4), (2, 4), (2, 3)]
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert caches[1].seq_len == caches[0].seq_len == 14
    for row, first in ((0, 6), (1, 0)):
        for kv in ("k", "v"):
            torch.testing.assert_close(getattr(caches[1], kv)[:, row, :, first:14],
                                       getattr(caches[0], kv)[:, row, :, first:14], rtol=1e-4, atol=5e-5)
    dm = model(n_kv_heads=2)
    dense = FastDecoder(dm)
    dense_calls = []
    dense_chunk = dense.chunk
    dense.chunk = lambda *a: dense_calls.append(a[0].shape) or dense_chunk(*a)
    longrope = {"rope_type": "longrope", "original_max_position_embeddings": 8,
                "short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [1.0 + 0.7 * i for i in range(8)]}
    lm = on_blocks(model(n_kv_heads=2, rope_scaling=longrope))
    long_dec = FastDecoder(lm, quant="gguf")
    assert long_dec.prompt_gemm
    long_calls = []
    long_chunk = long_dec.chunk
    long_dec.chunk = lambda *a: long_calls.append(a[0].shape) or long_chunk(*a)
    with torch.no_grad():
        prefill(dm, ids[:1], torch.arange(11)[None], None, dm.new_kv_cache(1, 16), decoder=dense)
        prefill(lm, ids[:1, :7], torch.arange(7)[None], None, lm.new_kv_cache(1, 16), decoder=long_dec)
        prefill(lm, ids[:1], torch.arange(11)[None], None, lm.new_kv_cache(1, 16), decoder=long_dec)
    assert dense_calls == [] and long_calls == [(1, 7)]  # 11 tokens cross L0 = 8: the forward


def test_chunk_refuses_an_overflow_and_a_decoder_without_native() -> None:
    m = model(n_kv_heads=2)
    dec = FastDecoder(m)
    cache = m.new_kv_cache(1, 4)
    with pytest.raises(ValueError, match="KV cache overflow: 5 tokens > cache capacity 4"):
        dec.chunk(torch.zeros(1, 5, dtype=torch.long), torch.arange(5)[None], None, cache)
    dec.native = None
    with pytest.raises(ValueError, match="no C\\+\\+ step"):
        dec.chunk(torch.zeros(1, 2, dtype=torch.long), torch.arange(2)[None], None, cache)


def moe_on_blocks(m):
    """m with its matrices in ggml blocks (on_blocks) and each MoE layer's experts too: Q4_1 gate / up and Q8_0 down
    rows stacked per expert as a GGUF holds them, run by BlockExperts (the forward's experts and the C++ step's)."""
    from scratchlm.nn.block_experts import BlockExperts, expert_blocks

    on_blocks(m)
    for block in m.model.layers:
        if not block.moe:
            continue
        ex = block.mlp.experts
        parts = []
        for name, t in (("gate_proj", "Q4_1"), ("up_proj", "Q4_1"), ("down_proj", "Q8_0")):
            w = getattr(ex, name).detach()  # (E, rows, cols)
            stacked = quantize_blocks(w.reshape(-1, w.shape[-1]), t)
            parts.append(expert_blocks(t, stacked.data, tuple(w.shape)))
        block.mlp.experts = BlockExperts(*parts)
    return m


@pytest.mark.parametrize("router", ["softmax_topk", "topk_softmax"])
def test_moe_on_blocks_prefills_through_the_chunk_in_pieces(monkeypatch, router: str) -> None:
    """A mixture of experts in ggml blocks (experts too) takes long prompts through the C++ chunk as a dense model on
    blocks does (prompt_gemm; each expert on its own routed rows, moe_layer.h): a 2-row batch of 11 tokens in pieces
    of 4 on top of 3 cached tokens, logits and cache slots equal to the forward's (BlockExperts' grouped path)."""
    monkeypatch.setattr("scratchlm.generate.prefill.CHUNK_MAX_ROWS", 4)
    monkeypatch.setattr("scratchlm.generate.prefill.PROMPT_CHUNK_MAX_ROWS", 8)
    m = moe_on_blocks(model(n_kv_heads=2, moe_num_experts=4, moe_top_k=2, moe_d_ff=64, moe_router=router,
                            moe_dense_layers=(1,)))
    dec = FastDecoder(m, quant="gguf")
    assert dec.native is not None and dec.prompt_gemm
    calls = []
    chunk = dec.chunk
    dec.chunk = lambda *a: calls.append(tuple(a[0].shape)) or chunk(*a)
    g = torch.Generator().manual_seed(7)
    prefix, ids = torch.randint(0, 96, (2, 3), generator=g), torch.randint(0, 96, (2, 11), generator=g)
    caches = [m.new_kv_cache(2, 16), m.new_kv_cache(2, 16)]
    pos = torch.arange(14).expand(2, 14)
    with torch.no_grad():
        for c in caches:
            m(prefix, pos[:, :3], None, c)
        want = prefill(m, ids, pos[:, 3:], None, caches[0])
        got = prefill(m, ids, pos[:, 3:], None, caches[1], decoder=dec)
    assert calls == [(2, 4), (2, 4), (2, 3)]
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    for kv in ("k", "v"):
        torch.testing.assert_close(getattr(caches[1], kv)[..., :14, :], getattr(caches[0], kv)[..., :14, :],
                                   rtol=1e-4, atol=5e-5)
