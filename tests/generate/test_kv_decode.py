"""Cached decoding (prefill + one-token steps through the static KVCache) equals a full forward."""

from __future__ import annotations

import pytest
import torch

from gen_helpers import VARIANTS, build, small_config
from scratchlm.generate.engine import iter_decode
from scratchlm.generate.sampling import SamplingParams

ALL = [*VARIANTS, "gpt2-tiny"]
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ALL)
def test_cached_decode_logits_equal_full_forward(variant: str) -> None:
    model = build(small_config(variant))
    ids = torch.randint(0, 128, (2, 20))
    p = 7
    cache = model.new_kv_cache(2, max_seq_len=20)
    with torch.no_grad():
        full = model(ids)  # (B, 20, V)
        prefill = model(ids[:, :p], kv_cache=cache)
        torch.testing.assert_close(prefill, full[:, :p], **TOL)
        for t in range(p, 20):
            step = model(ids[:, t:t + 1], kv_cache=cache)  # (B, 1, V)
            torch.testing.assert_close(step[:, 0], full[:, t], **TOL)
    assert cache.seq_len == 20


@pytest.mark.parametrize("variant", ALL)
def test_engine_logits_equal_full_forward_every_step_with_left_padding(variant: str) -> None:
    """Rows of different lengths decoded together: each step's logits equal the row's own full forward."""
    model = build(small_config(variant), scale=3.0)
    prompts = [[5, 9, 2, 77, 31, 8], [40], [3, 3, 100]]
    steps = list(iter_decode(model, prompts, 6, SamplingParams()))
    generated = torch.stack([tok for tok, _ in steps], dim=1)  # (B, 6)
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            seq = torch.tensor([prompt + generated[row].tolist()])
            full = model(seq)[0]  # (T, V)
            for i, (_, logits) in enumerate(steps):
                torch.testing.assert_close(logits[row], full[len(prompt) - 1 + i], **TOL)


def test_kv_cache_bytes_per_token_counts_only_kv_heads() -> None:
    """2 (K and V) * layers * KvH * Hd * 4 bytes: GQA stores H / KvH times less than MHA."""
    gqa = build(small_config("llama-gqa-half")).new_kv_cache(1, 8)
    mha = build(small_config("llama-mha")).new_kv_cache(1, 8)
    assert gqa.bytes_per_token() == 2 * 2 * 2 * 16 * 4
    assert mha.bytes_per_token() == 2 * gqa.bytes_per_token()


@pytest.mark.parametrize("variant", ["llama-gqa-half", "gpt2-tiny"])
def test_logits_to_keep_returns_the_last_positions(variant: str) -> None:
    """Same logits for the kept positions (matmuls of another row count may round differently: 1e-6)."""
    model = build(small_config(variant))
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(model(ids, logits_to_keep=1), full[:, -1:], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model(ids, logits_to_keep=3), full[:, -3:], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model(ids, logits_to_keep=0), full, rtol=0, atol=0)
