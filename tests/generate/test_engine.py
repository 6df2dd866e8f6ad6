"""The engine: batched greedy == each prompt alone == a no-cache reference; stops; errors; seeds."""

from __future__ import annotations

import pytest
import torch

from gen_helpers import build, greedy_full_forward, small_config
from scratchlm.generate import generate
from scratchlm.tokenizer import Tokenizer

PROMPTS = [[5, 9, 2, 77, 31, 8, 60], [40], [3, 3, 100, 7]]


@pytest.fixture(scope="module")
def model():
    return build(small_config("llama-gqa-half").replace(tie_embeddings=False), scale=3.0)


@pytest.fixture(scope="module")
def byte_tokenizer() -> Tokenizer:
    """Every byte is one token: token id i <-> byte i (ids < 128 are ASCII)."""
    return Tokenizer({i: bytes([i]) for i in range(256)}, [], None)


@pytest.mark.parametrize("variant", ["llama-gqa-half", "llama-gqa-interleaved", "llama-sdpa", "gpt2-tiny"])
def test_batched_rows_equal_each_prompt_alone_and_no_cache_reference(variant: str) -> None:
    m = build(small_config(variant).replace(tie_embeddings=False), scale=3.0)
    batched = generate(m, PROMPTS, 8)
    for prompt, row in zip(PROMPTS, batched):
        assert len(set(row)) > 2, "degenerate model output makes this test weak"
        assert generate(m, [prompt], 8)[0] == row
        assert greedy_full_forward(m, prompt, 8) == row


def test_max_new_tokens_and_stop_token_ids(model) -> None:
    full = generate(model, PROMPTS, 10)
    assert [len(r) for r in full] == [10, 10, 10]
    stop = full[0][4]
    first = full[0].index(stop)
    out = generate(model, PROMPTS, 10, stop_token_ids=[stop])
    assert out[0] == full[0][: first + 1]  # ends at (and keeps) the stop token
    for ref, row in zip(full[1:], out[1:]):
        cut = ref.index(stop) + 1 if stop in ref else len(ref)
        assert row == ref[:cut]


def test_stop_strings_end_the_row(model, byte_tokenizer) -> None:
    ref = generate(model, PROMPTS[:1], 12)[0]
    text = bytes(ref).decode("latin-1")
    stop = text[5:7]
    out = generate(model, PROMPTS[:1], 12, stop_strings=[stop], tokenizer=byte_tokenizer)[0]
    assert out == ref[: text.index(stop) + len(stop)]
    with pytest.raises(ValueError, match="tokenizer"):
        generate(model, PROMPTS, 4, stop_strings=["x"])


def test_seeded_sampling_reproducible(model) -> None:
    kw = dict(temperature=1.0, top_k=20, top_p=0.95, repetition_penalty=1.1, frequency_penalty=0.1)
    a = generate(model, PROMPTS, 10, seed=3, **kw)
    b = generate(model, PROMPTS, 10, seed=3, **kw)
    c = generate(model, PROMPTS, 10, seed=4, **kw)
    assert a == b and a != c


def test_repetition_penalty_changes_greedy_choice(model) -> None:
    """With a huge penalty no token of the prompt/history can win while unseen ones remain."""
    out = generate(model, [[1, 2, 3]], 8, repetition_penalty=1e6)[0]
    assert len(set(out)) == len(out) and not {1, 2, 3} & set(out)


def test_context_overflow_is_a_clear_error(model) -> None:
    with pytest.raises(ValueError, match=r"context overflow.*max_seq_len=64.*max_new_tokens to 57"):
        generate(model, PROMPTS, 58)
    assert len(generate(model, PROMPTS, 57)[0]) == 57


@pytest.mark.parametrize(
    "prompts, match",
    [([], "non-empty"), ([[]], "empty"), ([[1, 500]], "outside the vocabulary"), (["hi"], "encode text first")],
)
def test_bad_prompts(model, prompts, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(model, prompts, 4)


def test_bad_options(model) -> None:
    with pytest.raises(ValueError, match="unknown sampling option"):
        generate(model, PROMPTS, 4, temprature=1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, PROMPTS, 0)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, PROMPTS, 4, top_p=0.0)


def test_engine_leaves_grad_mode_alone(model) -> None:
    assert torch.is_grad_enabled()
    generate(model, PROMPTS, 3)
    assert torch.is_grad_enabled()
