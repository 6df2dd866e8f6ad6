"""Sliding-window attention: the mask matches transformers' rule, and every path (full forward, chunked
and one-token cached decode, left-padded batches, SDPA, the FastDecoder) computes the same function for
sequences several windows long. The KV cache keeps the whole sequence; windows are masks."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import causal_mask_function, sliding_window_overlay

from scratchlm.config import ModelConfig
from scratchlm.generate.engine import generate
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.model import TransformerLM
from scratchlm.nn.masks import causal_mask

W = 5


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Tiny models: one torch thread is fastest and keeps the shared cores from thrashing."""
    yield


CONFIG = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=64, sliding_window=W, tie_embeddings=False,
                     layer_types=("sliding_attention", "full_attention", "sliding_attention"))


@pytest.mark.parametrize("t_q,t_k,start", [(12, 12, 0), (1, 20, 19), (4, 20, 16)])
def test_window_mask_is_transformers_rule(t_q, t_k, start):
    ours = causal_mask(t_q, t_k, start, window=W)
    causal, window = causal_mask_function, sliding_window_overlay(W)
    expected = torch.tensor([[bool(causal(0, 0, start + i, j)) and bool(window(0, 0, start + i, j)) for j in range(t_k)]
                             for i in range(t_q)])
    assert torch.equal(ours, expected)
    assert ours.sum(-1).max() == W  # never more than W keys


def _model(**overrides) -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(CONFIG.replace(**overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0) if p.dim() == 2 else p.copy_(torch.rand(p.shape) + 0.5)
    return model


def _brute_force_window_logits(model: TransformerLM, ids: torch.Tensor) -> torch.Tensor:
    """Position t of a sliding layer only sees tokens t-W+1..t: run the stack on explicit windows via masks
    built the slow way (a loop), independent of nn.masks."""
    t = ids.shape[1]
    band = torch.tensor([[t_k <= t_q and t_k > t_q - W for t_k in range(t)] for t_q in range(t)])
    full = torch.tensor([[t_k <= t_q for t_k in range(t)] for t_q in range(t)])
    x = model.model.embed_tokens(ids)
    for i, layer in enumerate(model.model.layers):
        mask = band if model.config.layer_window(i) else full
        x = layer(x, torch.arange(t), mask, False, None, i)
    return model.lm_head(model.model.norm(x))


@pytest.mark.parametrize("attn_impl", ["reference", "sdpa"])
def test_full_forward_and_cached_decode_equal_the_definition(attn_impl):
    model = _model(attn_impl=attn_impl)
    ids = torch.randint(0, 64, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _brute_force_window_logits(model, ids)
        torch.testing.assert_close(model(ids), expected, rtol=1e-5, atol=1e-5)
        cache = model.new_kv_cache(2)
        chunks = [model(ids[:, :9], kv_cache=cache), model(ids[:, 9:15], kv_cache=cache)]  # prefill + a chunk
        chunks += [model(ids[:, j:j + 1], kv_cache=cache) for j in range(15, 23)]  # one token at a time
        torch.testing.assert_close(torch.cat(chunks, 1), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("decode", ["model", "fast"])
def test_left_padded_batch_decodes_like_each_prompt_alone(decode):
    """Ragged prompts longer than W, decoded 16 steps in one padded batch == each alone (no padding)."""
    model = _model()
    prompts = [[3, 9, 27, 1, 5, 7, 60, 2, 8, 11, 13], [40, 41], [5, 6, 7, 8, 9, 10, 11]]
    batched = generate(model, prompts, 16, decode=decode)
    alone = [generate(model, [p], 16)[0] for p in prompts]
    assert batched == alone
    assert len({t for row in alone for t in row}) > 6


def test_fast_decoder_step_equals_model_step_past_the_window():
    model = _model()
    dec = FastDecoder(model)
    ids = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(3))
    key_mask = torch.ones(2, 20, dtype=torch.bool)
    key_mask[1, :2] = False  # row 1 is left-padded by two slots
    positions = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]])
    ref_cache, fast_cache = model.new_kv_cache(2, 20), model.new_kv_cache(2, 20)
    with torch.no_grad():
        model(ids, positions, key_mask[:, :4], ref_cache)
        model(ids, positions, key_mask[:, :4], fast_cache)
        tok, pos = ids[:, -1], positions[:, -1] + 1
        for s in range(4, 16):  # the window (5) is passed after the first steps
            ref = model(tok[:, None], pos[:, None], key_mask[:, : s + 1], ref_cache)[:, -1]
            got = dec.step(tok, pos, key_mask[:, : s + 1], fast_cache)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            tok, pos = ref.argmax(-1), pos + 1


@pytest.mark.parametrize("bad,match", [
    (dict(sliding_window=0), "sliding_window must be a positive integer"),
    (dict(layer_types=("full_attention",)), "layer_types has 1 entries for n_layers=3"),
    (dict(layer_types=("local",) * 3), r"layer_types has \['local'\]"),
    (dict(sliding_window=None), "sliding_attention' layers but sliding_window is None"),
])
def test_bad_window_fields_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        CONFIG.replace(**bad)
