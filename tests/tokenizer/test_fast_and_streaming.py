"""The tiktoken fast path on byte-level pipelines (GPT-2, Llama-3 Split + ignore_merges with tiktoken-converted
merges, Qwen2 NFC + Split, a vocabulary missing single bytes) gives HF's ids; pipelines it cannot reproduce
are refused by name;
streaming encodes exactly like one call, in bounded chunks where the pipeline allows it."""

from __future__ import annotations

import json
import random

import pytest

import scratchlm.tokenizer.stream_encode as streaming
from scratchlm.tokenizer import Tokenizer

from . import hf_styles


@pytest.fixture(scope="module")
def built(shared_data, tmp_path_factory):
    tmp, cache = tmp_path_factory.mktemp("fast"), {}

    def get(name):
        if name not in cache:
            hf = hf_styles.build(name, shared_data, tmp)
            cache[name] = hf, json.loads(hf.to_str())
        return cache[name]

    return get


@pytest.fixture(scope="module")
def lines(shared_data):
    return hf_styles.sample_lines(shared_data)


def _drop_bytes(d: dict, chars: str) -> dict:
    """The tokenizer.json without the single-byte tokens `chars` (and the tokens and merges that use them),
    ids renumbered densely as a trainer that never saw those bytes would number them."""
    d = json.loads(json.dumps(d))
    kept = [s for s, _ in sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1]) if not set(s) & set(chars)]
    d["model"]["vocab"] = {s: i for i, s in enumerate(kept)}
    d["model"]["merges"] = [m for m in d["model"]["merges"] if not set("".join(m)) & set(chars)]
    n = len(kept)
    for a in sorted(d["added_tokens"], key=lambda a: a["id"]):
        if a["content"] in d["model"]["vocab"]:
            a["id"] = d["model"]["vocab"][a["content"]]
        else:
            a["id"], n = n, n + 1
    return d


@pytest.mark.parametrize("name", ["gpt2", "llama3_tiktoken", "qwen2_flags", "qwen2_missing_bytes"])
def test_tiktoken_fast_path_equals_hf(built, lines, shared_data, name):
    from tokenizers import Tokenizer as HFTokenizer

    hf, d = built(name.replace("_missing_bytes", "_flags"))
    if name.endswith("missing_bytes"):
        d = _drop_bytes(d, "ĄĆñò")  # bytes 0x04, 0x06, 0xF1, 0xF2 (SmolLM2 lacks these and 17 more)
        hf = HFTokenizer.from_str(json.dumps(d))
    fast = Tokenizer.from_hf_dict(d, impl="tiktoken")
    text = "\n".join(lines) + (shared_data / "tinyshakespeare.txt").read_text(encoding="utf-8")[:300_000]
    assert fast.encode(text) == hf.encode(text, add_special_tokens=False).ids
    for line in lines[::7] + ["a\x04b \U00040000 ñ", "\x06"]:
        assert fast.encode(line, add_special_tokens=True) == hf.encode(line).ids, line


@pytest.mark.parametrize("name,why", [("llama2", "is not a tested GPT-2 / Llama-3 / Qwen2 regex split"),
                                      ("kitchen_flags", "is not a tested GPT-2 / Llama-3 / Qwen2 regex split")])
def test_fast_path_refuses_other_pipelines(built, name, why):
    with pytest.raises(ValueError, match=why + ".*use impl='reference'"):
        Tokenizer.from_hf_dict(built(name)[1], impl="tiktoken")


def test_fast_path_refuses_vocabularies_where_tiktoken_would_differ(built):
    """Tokens the merges never make: tiktoken's whole-piece lookup would return them where HF without
    ignore_merges does not; and a token two other tokens concatenate to without that merge: tiktoken joins
    the pair, HF does not ("Ġaccess" in "Ġaccessary" of the Llama-3-style fixture)."""
    d = json.loads(json.dumps(built("llama3")[1]))
    with pytest.raises(ValueError, match="is the concatenation of tokens .* which is not a merge"):
        Tokenizer.from_hf_dict(d, impl="tiktoken")
    d["model"]["ignore_merges"] = False
    with pytest.raises(ValueError, match="is not what the merges make of its own bytes"):
        Tokenizer.from_hf_dict(d, impl="tiktoken")


STREAM_PIECES = ["the", " King", "'RE", "'", "r", "e", " ", "  ", "\n", "\n\n", " \n", "x\nY", "é", "e\u0301", "🎉",
                 "123", "4", "<|im_start|>", "<|im_", "end|>", ".", "\t", "日\n本", "\u3000", "ﬁ"]


@pytest.mark.parametrize("name", ["llama3", "qwen2_flags", "mistral", "gemma"])
def test_encode_iterable_equals_encode(built, name, monkeypatch):
    tok = Tokenizer.from_hf_dict(built(name)[1])
    monkeypatch.setattr(streaming, "BUFFER_CHARS", 16)  # force many cuts where cuts are allowed
    rng = random.Random(0)
    for _ in range(40):
        text = "".join(rng.choice(STREAM_PIECES) for _ in range(rng.randint(0, 60)))
        pieces = [text[i:i + 5] for i in range(0, len(text), 5)]
        assert list(tok.encode_iterable(pieces)) == tok.encode(text), text


def test_streaming_cuts_only_where_exact(built):
    """Byte-level regex pipelines stream in bounded chunks; Metaspace pipelines wait for the whole text."""
    llama3 = Tokenizer.from_hf_dict(built("llama3")[1])
    mistral = Tokenizer.from_hf_dict(built("mistral")[1])
    assert streaming.stream_safe(llama3) is not None and streaming.stream_safe(mistral) is None
    text = "To be, or not to be\nthat is the question.\n" * 4000
    chunks = list(streaming.encode_stream_chunks(llama3, [text[i:i + 100] for i in range(0, len(text), 100)]))
    assert len(chunks) > 1 and sum(chunks, []) == llama3.encode(text)
