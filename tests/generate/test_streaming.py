"""Streaming: text deltas never split a UTF-8 character, never leak a stop string, and add up to the text."""

from __future__ import annotations

import pytest

from gen_helpers import build, small_config
from scratchlm.generate import generate
from scratchlm.generate.detokenize import IncrementalDetokenizer
from scratchlm.generate.stopping import StopChecker
from scratchlm.generate.streaming import stream_generate
from scratchlm.tokenizer import Tokenizer

TEXT = "héllo wörld 🙂 日本語 ok"


@pytest.fixture(scope="module")
def byte_tok() -> Tokenizer:
    return Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|im_end|>"])


def test_byte_by_byte_deltas_are_whole_characters(byte_tok) -> None:
    """One token per byte: a 4-byte emoji arrives as 3 empty deltas then the whole character."""
    dec = IncrementalDetokenizer(byte_tok)
    deltas = [dec.push(b) for b in TEXT.encode("utf-8")]
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)
    expected = [ch for ch in TEXT for _ in range(len(ch.encode()) - 1)]  # empty deltas while a char is partial
    assert sum(1 for d in deltas if d == "") == len(expected)
    assert [d for d in deltas if d] == list(TEXT)


def test_dangling_partial_character_is_flushed_as_replacement(byte_tok) -> None:
    dec = IncrementalDetokenizer(byte_tok)
    assert dec.push(0xE6) == "" and dec.push(0x97) == ""  # first 2 of 3 bytes of "日"
    assert dec.flush() == "\ufffd"


def test_stop_string_is_held_back_then_cut(byte_tok) -> None:
    """Stream "abc<STOP>def" byte by byte with stop string "<STOP>": shown text never holds "<S..."."""
    stopper = StopChecker(1, [], ["<STOP>"], byte_tok, track_text=True)
    shown = []
    for b in b"abc<STOP>def":
        stopper.push(0, b)
        shown.append(stopper.text(0)[: stopper.stable_len(0)])
        if stopper.done[0]:
            break
    assert stopper.text(0) == "abc" and stopper.reasons[0] == "stop"
    assert all(s in ("", "a", "ab", "abc") for s in shown)


def test_stream_generate_joins_to_generate_text(byte_tok) -> None:
    """Streaming a model whose bytes form multi-byte characters: deltas join to the decoded generate output."""
    model = build(small_config("llama-gqa-half").replace(vocab_size=256, tie_embeddings=False), scale=3.0)
    prompt = list("日本".encode())
    ids = generate(model, [prompt], 30)[0]
    deltas = list(stream_generate(model, byte_tok, prompt, 30, stop_token_ids=[]))
    full = bytes(ids).decode("utf-8", errors="replace")
    assert "".join(deltas) == full
    # a split character would leave a U+FFFD where the full text has the character: every shown
    # prefix must be a prefix of the full text
    assert all(full.startswith("".join(deltas[:k])) for k in range(len(deltas) + 1))


def test_stream_stops_at_stop_id_without_showing_it(byte_tok) -> None:
    model = build(small_config("llama-gqa-half").replace(vocab_size=256, tie_embeddings=False), scale=3.0)
    prompt = [104, 105]
    ids = generate(model, [prompt], 20)[0]
    stop = ids[6]
    text = "".join(stream_generate(model, byte_tok, prompt, 20, stop_token_ids=[stop]))
    assert text == bytes(ids[: ids.index(stop)]).decode("utf-8", errors="replace")
