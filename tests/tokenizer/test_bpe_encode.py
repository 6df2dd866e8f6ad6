"""Encoding/decoding: round trips on varied Unicode, special-token edge cases, streaming, bad ids."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scratchlm.tokenizer.stream_encode as streaming
from scratchlm.tokenizer import Tokenizer

from .conftest import MULTILINGUAL


@pytest.mark.parametrize("text", MULTILINGUAL)
def test_round_trip_multilingual(shakespeare_tok, multilingual_tok, gpt2_tok, text):
    for tok in (shakespeare_tok, multilingual_tok, gpt2_tok):
        assert tok.decode(tok.encode(text)) == text


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=60))
def test_round_trip_any_unicode(multilingual_tok, text):
    ids = multilingual_tok.encode(text)
    assert multilingual_tok.decode(ids) == text
    assert multilingual_tok.decode_bytes(ids) == text.encode("utf-8", errors="surrogatepass")


def test_merges_cut_multibyte_chars_and_partial_decode_is_replacement(multilingual_tok):
    tok = multilingual_tok
    # some learned token is a partial UTF-8 sequence (the corpus is mostly multi-byte text)
    partial = [i for i, t in tok.vocab.items() if i >= 259 and t.decode("utf-8", errors="replace") != t.decode("utf-8", errors="ignore")]
    assert partial
    for i in partial[:50]:
        assert tok.decode([i]) == tok.vocab[i].decode("utf-8", errors="replace")
    ids = tok.encode("日本語 🎉")
    for k in range(len(ids) + 1):  # every prefix decodes without raising, as Python's decoder would
        assert tok.decode(ids[:k]) == tok.decode_bytes(ids[:k]).decode("utf-8", errors="replace")


@pytest.mark.parametrize("bad", [1024, 10**9, -1])
def test_decode_unknown_id(shakespeare_tok, bad):
    with pytest.raises(ValueError, match=f"token id {bad} is not in the vocabulary \\(vocab_size 1024\\)"):
        shakespeare_tok.decode([65, bad, 66])


def _specials_tok(base: Tokenizer, specials: list[str]) -> Tokenizer:
    vocab = {i: t for i, t in base.vocab.items() if i not in base.special_token_ids.values()}
    return Tokenizer(vocab, base.merges, specials)


def test_overlapping_specials_match_longest_first(shakespeare_tok):
    eot, double = "<|endoftext|>", "<|endoftext|><|endoftext|>"
    tok = _specials_tok(shakespeare_tok, [eot, double])
    e, d = tok.special_token_ids[eot], tok.special_token_ids[double]
    assert e != d and tok.decode([d]) == double
    text = "a" + eot * 3 + "b"
    assert tok.encode(text) == tok.encode_ordinary("a") + [d, e] + tok.encode_ordinary("b")
    assert tok.encode(eot * 4) == [d, d]


def test_special_that_is_prefix_of_another(shakespeare_tok):
    tok = _specials_tok(shakespeare_tok, ["<|im", "<|im_start|>"])
    short, long = tok.special_token_ids["<|im"], tok.special_token_ids["<|im_start|>"]
    assert tok.encode("<|im_start|>") == [long]
    assert tok.encode("<|im_end|>") == [short] + tok.encode_ordinary("_end|>")
    assert tok.encode("x<|im<|im_start|>") == tok.encode_ordinary("x") + [short, long]


def test_specials_never_merge_with_neighbours(shakespeare_tok):
    tok = shakespeare_tok
    eot = tok.special_token_ids["<|endoftext|>"]
    text = "the end.<|endoftext|> The start<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(text)
    assert ids.count(eot) == 1 and tok.decode(ids) == text
    before, after = "the end.", " The start"
    assert ids[: ids.index(eot) + 1] == tok.encode_ordinary(before) + [eot]
    assert tok.encode_ordinary("<|endoftext|>") == tok.encode_ordinary("<|") + tok.encode_ordinary("endoftext") + tok.encode_ordinary("|>")
    assert eot not in tok.encode_ordinary(text)
    assert tok.encode(after) == ids[ids.index(eot) + 1: ids.index(eot) + 1 + len(tok.encode(after))]


def test_tokenizer_without_specials_treats_them_as_text(shakespeare_tok):
    tok = _specials_tok(shakespeare_tok, [])
    assert tok.special_token_ids == {} and tok.encode("<|endoftext|>") == tok.encode_ordinary("<|endoftext|>")


STREAM_TEXT = st.lists(
    st.sampled_from(["the", " king", "'re", "'", "r", "e", " ", "  ", "\n", "\n\n", " \n", "x\nY", "é", "🎉", "1",
                     "<|endoftext|>", "<|end", "oftext|>", "<|im_start|>", "<|im_end|>", ".", "\t", "日\n本", "\nΩ", "\u3000"]),
    max_size=120,
).map("".join)


@settings(max_examples=120, deadline=None)
@given(text=STREAM_TEXT, seed=st.integers(0, 2**16), buffer_chars=st.integers(1, 40))
def test_encode_iterable_equals_encode(shakespeare_tok, text, seed, buffer_chars):
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 9)
        pieces.append(text[i:i + n])
        i += n
    old = streaming.BUFFER_CHARS
    streaming.BUFFER_CHARS = buffer_chars  # force many cuts
    try:
        assert list(shakespeare_tok.encode_iterable(pieces)) == shakespeare_tok.encode(text)
    finally:
        streaming.BUFFER_CHARS = old


def test_encode_iterable_of_file_lines(shakespeare_tok, shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:300_000]
    lines = text.splitlines(keepends=True)
    assert list(shakespeare_tok.encode_iterable(lines)) == shakespeare_tok.encode(text)


def _peak_streaming_bytes(tok: Tokenizer, lines: list[str], copies: int) -> tuple[int, int]:
    def stream():
        for _ in range(copies):
            yield from lines

    tok.model.clear_cache()
    tracemalloc.start()
    try:
        n = sum(1 for _ in tok.encode_iterable(stream()))
        return tracemalloc.get_traced_memory()[1], n
    finally:
        tracemalloc.stop()


def test_encode_iterable_memory_is_bounded(shakespeare_tok, shared_data):
    lines = (shared_data / "corpus.en").read_text(encoding="utf-8").splitlines(keepends=True)
    size = sum(len(x.encode()) for x in lines)
    peak2, n2 = _peak_streaming_bytes(shakespeare_tok, lines, 2)
    peak6, n6 = _peak_streaming_bytes(shakespeare_tok, lines, 6)
    assert n6 == 3 * n2
    # +4 copies of the text (+0.5 MB as str, +~1.5 MB of ids as a Python list) yet the same peak (the bounded
    # pre-token cache and the ~64k-char buffer): nothing grows with the input
    assert peak6 < peak2 + size / 2, (peak2, peak6, size)


def test_encode_rejects_bytes(shakespeare_tok):
    with pytest.raises(ValueError, match="encode expects str, got bytes"):
        shakespeare_tok.encode(b"hello")
    with pytest.raises(ValueError, match="expects str items, got bytes"):
        list(shakespeare_tok.encode_iterable([b"hello"]))
