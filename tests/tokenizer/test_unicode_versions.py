"""Chars newer than the Unicode tables of HF's regex engine (Oniguruma) and tiktoken's: Python's `regex`
module knows them as letters, digits, marks or symbols, HF and tiktoken see unassigned chars, so
`\\p{L}+` stops at them. scratchlm cuts where HF and tiktoken cut (unicode_props.as_regex_engines_see)."""

from __future__ import annotations

import json
import random

import pytest
import regex
from tokenizers import Regex, pre_tokenizers

from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.unicode_props import NEWER_THAN_ONIG

from . import hf_styles

CODE_POINTS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def test_table_is_what_oniguruma_does_not_know():
    """NEWER_THAN_ONIG == the chars HF's regex engine matches as \\p{Cn} but the `regex` module does not."""
    text = "".join(map(chr, CODE_POINTS))
    kept = bytearray(len(text))
    for _, (a, b) in pre_tokenizers.Split(Regex(r"\p{Cn}"), behavior="removed").pre_tokenize_str(text):
        kept[a:b] = b"\x01" * (b - a)
    hf_unassigned = {CODE_POINTS[i] for i, k in enumerate(kept) if not k}
    ours_unassigned = {m.start() for m in regex.finditer(r"\p{Cn}", text)}
    ours_unassigned = {CODE_POINTS[i] for i in ours_unassigned}
    table = {CODE_POINTS[m.start()] for m in NEWER_THAN_ONIG.finditer(text)}
    assert table == hf_unassigned - ours_unassigned
    assert not ours_unassigned - hf_unassigned


def _lines() -> list[str]:
    rng = random.Random(0)
    newer = [c for c in CODE_POINTS if NEWER_THAN_ONIG.match(chr(c))]
    pieces = ["the", " cat", "日本", "12", " ", "  ", "\n", "é", "'s", "!", "🎉", "<|im_end|>"]
    out = []
    for _ in range(250):
        out.append("".join(chr(rng.choice(newer)) if rng.random() < 0.4 else rng.choice(pieces)
                           for _ in range(rng.randint(1, 10))))
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama3_tiktoken", "qwen2_flags", "gemma"])
def test_ids_equal_hf_and_tiktoken(shared_data, tmp_path_factory, name):
    hf = hf_styles.build(name, shared_data, tmp_path_factory.mktemp("newer"))
    d = json.loads(hf.to_str())
    ours = Tokenizer.from_hf_dict(d)
    fast = Tokenizer.from_hf_dict(d, impl="tiktoken") if name != "gemma" else ours
    for line in _lines():
        want = hf.encode(line, add_special_tokens=False)
        assert ours.encode(line) == want.ids, ascii(line)
        assert ours.encode_with_offsets(line).offsets == want.offsets, ascii(line)
        assert fast.encode(line) == want.ids, ascii(line)


@pytest.mark.parametrize("d", [{"type": "Punctuation", "behavior": "Isolated"}, {"type": "Digits", "individual_digits": True}],
                         ids=lambda d: d["type"])
def test_char_class_pre_tokenizers_equal_hf(d):
    """HF computes these classes with Rust tables of other Unicode versions (punctuation: the
    unicode_categories crate; digits: char::is_numeric). Every 5th
    code point, and every char of the version tables and of the classes they amend."""
    from scratchlm.tokenizer import pre_tokenizers as ours_pre

    amended = regex.compile(r"[\p{P}\p{N}\p{So}]")
    points = CODE_POINTS[::5] + [c for c in CODE_POINTS if NEWER_THAN_ONIG.match(chr(c)) or amended.match(chr(c))]
    text = "a".join(map(chr, sorted(set(points))))
    hf_pre = {"Punctuation": pre_tokenizers.Punctuation(), "Digits": pre_tokenizers.Digits(individual_digits=True)}[d["type"]]
    want = [p for p, _ in hf_pre.pre_tokenize_str(text)]
    assert ours_pre.from_json(d).pre_tokenize([text]) == want


@pytest.mark.parametrize("form", ["Lowercase", "NFC", "NFD", "NFKC", "NFKD"])
def test_normalizers_equal_hf(form):
    """HF's Lowercase (Rust's to_lowercase) knows newer case pairs than Python 3.11, its normalization
    tables (unicode-normalization-alignments) fewer decompositions and combining classes: every char
    with a decomposition, a case mapping or a combining class, alone, after "a" (compositions), and
    every mark after a class-240 mark (reordering)."""
    import unicodedata

    from tokenizers import normalizers

    from scratchlm.tokenizer import normalizers as ours_norm
    from scratchlm.tokenizer.normalized import NormalizedText

    chars = [chr(c) for c in CODE_POINTS if unicodedata.decomposition(chr(c)) or chr(c).lower() != chr(c)
             or unicodedata.combining(chr(c))]
    chars += ["\U00011935\U00011930", "\u32ff", "\ua7cb", "\U00010d50", "\U00016ea0"]  # newer than a side
    marks = [c for c in chars if len(c) == 1 and unicodedata.combining(c)]
    text = " ".join(chars) + " " + " ".join("a" + c for c in chars) + " " + " ".join("e\u0345" + m for m in marks)
    want = getattr(normalizers, form)().normalize_str(text)
    assert ours_norm.from_json({"type": form}).normalize(NormalizedText(text)).text == want


def test_single_word_neighbours_as_hf_sees_them():
    """A single_word added token next to a char newer than HF's regex tables is alone (HF's \\w does not
    know that char)."""
    from tokenizers import AddedToken, models
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    hf.add_tokens([AddedToken("Q", single_word=True, normalized=False)])
    ours = Tokenizer.from_hf_dict(json.loads(hf.to_str()))
    chars = [chr(c) for c in CODE_POINTS[::40] if c != ord("Q")]
    chars += [chr(c) for c in CODE_POINTS if NEWER_THAN_ONIG.match(chr(c))][::4]
    texts = [t for c in chars for t in ("Q" + c, c + "Q")]
    for text, want in zip(texts, hf.encode_batch(texts, add_special_tokens=False)):
        assert ours.encode(text) == want.ids, ascii(text)
