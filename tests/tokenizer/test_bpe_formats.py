"""Our readable tokenizer files: exact round trips, model-directory coexistence, malformed files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.vocab_files import MERGES_FILE, META_FILE, VOCAB_FILE, escape_token, unescape_token


@settings(max_examples=300, deadline=None)
@given(token=st.binary(min_size=1, max_size=12) | st.text(min_size=1, max_size=8).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_escape_round_trip_any_bytes(token):
    text = escape_token(token)
    assert "\n" not in text and "\t" not in text
    assert unescape_token(text) == token


def test_escape_is_readable():
    assert escape_token(b" the") == " the"
    assert escape_token("café\n".encode()) == "café\\n"
    assert escape_token(b"\\x41") == "\\\\x41"
    assert escape_token(b"\xc3") == "\\xc3" and escape_token(b"\x00\t") == "\\x00\\t"


@pytest.mark.parametrize("name", ["shakespeare_tok", "multilingual_tok", "gpt2_tok"])
def test_save_load_round_trip_exact(request, tmp_path, name):
    tok = request.getfixturevalue(name)
    tok.save(tmp_path)
    back = Tokenizer.load(tmp_path)
    assert back.vocab == tok.vocab and back.merges == tok.merges
    assert back.special_token_ids == tok.special_token_ids and back.vocab_size == tok.vocab_size
    text = "Hello <|endoftext|> wörld 🎉 日本"
    assert back.encode(text) == tok.encode(text)


def test_loads_from_model_directory_without_clashing(shakespeare_tok, tmp_path):
    (tmp_path / "config.json").write_text('{"model": "checkpoint config"}')
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "tokenizer.json").write_text("{}")
    shakespeare_tok.save(tmp_path)
    assert (tmp_path / "config.json").read_text() == '{"model": "checkpoint config"}'
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"
    assert (tmp_path / "tokenizer.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", META_FILE, VOCAB_FILE, MERGES_FILE])
    assert Tokenizer.load(tmp_path).vocab == shakespeare_tok.vocab


def test_load_errors(shakespeare_tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="no scratchlm tokenizer in .*scratchlm tokenizer train"):
        Tokenizer.load(tmp_path)
    shakespeare_tok.save(tmp_path)
    vocab = (tmp_path / VOCAB_FILE).read_text().split("\n")
    (tmp_path / VOCAB_FILE).write_text("\n".join(vocab[:3] + ["oops"] + vocab[4:]))
    with pytest.raises(ValueError, match=r"scratchlm_vocab.txt line 4: expected '<id>\\t<token>'"):
        Tokenizer.load(tmp_path)
    (tmp_path / VOCAB_FILE).write_text("\n".join(vocab[:300] + [""]))  # drop merged tokens
    with pytest.raises(ValueError, match="merge #.* not in the vocab"):
        Tokenizer.load(tmp_path)
    meta = json.loads((tmp_path / META_FILE).read_text())
    (tmp_path / META_FILE).write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ValueError, match="expected 'scratchlm-bpe' v1"):
        Tokenizer.load(tmp_path)


def test_constructor_rejects_bad_vocab(shakespeare_tok):
    vocab = dict(shakespeare_tok.vocab)
    del vocab[65]
    with pytest.raises(ValueError, match=r"lacks single-byte tokens \[65\]"):
        Tokenizer(vocab, [], [])
    with pytest.raises(ValueError, match="impl='fast' is not one of"):
        Tokenizer(shakespeare_tok.vocab, shakespeare_tok.merges, impl="fast")
    dup = {**{i: bytes([i]) for i in range(256)}, 256: b"ab", 257: b"ab"}
    with pytest.raises(ValueError, match="both hold b'ab'"):
        Tokenizer(dup, [(b"a", b"b")], [])
