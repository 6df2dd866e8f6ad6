"""Tokenizer test fixtures: trained tokenizers, GPT-2's files, and tiktoken's GPT-2 built offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
from scratchlm.tokenizer.hf_files import load_gpt2_files

# tiktoken's own GPT-2 split pattern (from tiktoken_ext/openai_public.py), typed independently of ours.
TIKTOKEN_GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_MERGES_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"  # with "#version: 0.2"
GPT2_VOCAB_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

MULTILINGUAL = [
    "Hello, world! It's 2026; we've got 3.14 apples & 42 pears.",
    "Grüße aus Köln — naïve café, façade, jalapeño, Æsir, smørrebrød.",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "日本語のテキスト、漢字とひらがなとカタカナ。中文：你好，世界！한국어 문장입니다.",
    "العربية: مرحبا بالعالم. עברית: שלום עולם. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก",
    "emoji 🎉🔥👍🏽 👨‍👩‍👧‍👦 🇺🇳 flags, ZWJ and skin tones; math ∑∫√∞ ≠ ≤; arrows ←→",
    "  leading spaces\n\n\ttabs\r\n  trailing   \n\n\n   \u00a0nbsp\u2028line sep\u3000ideo space ",
    "contractions: I'm, you're, they've, she'll, he'd, it's, don't, 'S 'RE '' 're",
    "numbers 1234567890 ٣٤٥ ① Ⅻ, symbols \\ / | ~ ` ^ _ { } [ ] < > <| |> <|endoftext",
    "\x00\x01\x7f control chars \x1b[31m and the replacement char \ufffd and surrogates-free text",
]


@pytest.fixture(scope="session")
def shakespeare_path(shared_data: Path) -> Path:
    return shared_data / "tinyshakespeare.txt"


@pytest.fixture(scope="session")
def shakespeare_tok(shakespeare_path: Path) -> Tokenizer:
    """A 1024-token BPE trained on tinyshakespeare with the default chat specials."""
    vocab, merges = train_bpe(shakespeare_path, 1024, DEFAULT_SPECIAL_TOKENS, num_workers=1)
    return Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)


@pytest.fixture(scope="session")
def multilingual_tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A BPE trained on the multilingual strings, so merges cut through multi-byte characters."""
    path = tmp_path_factory.mktemp("ml") / "ml.txt"
    path.write_text("<|endoftext|>".join(MULTILINGUAL * 3), encoding="utf-8")
    vocab, merges = train_bpe(path, 700, DEFAULT_SPECIAL_TOKENS, num_workers=1)
    return Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)


@pytest.fixture(scope="session")
def gpt2_tok(shared_data: Path) -> Tokenizer:
    return load_gpt2_files(shared_data / "gpt2_vocab.json", shared_data / "gpt2_merges.txt")


@pytest.fixture(scope="session")
def tiktoken_gpt2(shared_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """tiktoken's GPT-2 encoding built offline by tiktoken's own loader from the shared files."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    merges = tmp_path_factory.mktemp("gpt2") / "vocab.bpe"
    merges.write_bytes(b"#version: 0.2\n" + (shared_data / "gpt2_merges.txt").read_bytes())
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # no cache: read exactly these files
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(
            str(merges), str(shared_data / "gpt2_vocab.json"), GPT2_MERGES_SHA256, GPT2_VOCAB_SHA256
        )
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old
    return tiktoken.Encoding(
        "gpt2-offline", pat_str=TIKTOKEN_GPT2_PAT, mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257,
    )
