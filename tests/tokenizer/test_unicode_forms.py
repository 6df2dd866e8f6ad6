"""NFC / NFD / NFKC / NFKD keep each output char's input span exactly as HF `tokenizers` aligns it, on
random strings dense in what moves chars around: combining marks out of canonical order, composition
exclusions that NFC decomposes (U+FB2C), Hangul jamo and syllables, compatibility expansions."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest
from tokenizers import Tokenizer as HFTokenizer

from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.unicode_forms import normalize_aligned

MARKS = list(range(0x300, 0x370)) + [0x5B0, 0x5BC, 0x5C1, 0x5C2, 0x614, 0x93C, 0x9BC, 0x3099, 0x309A, 0x1DC0,
                                     0x20D0, 0x302A, 0xF71, 0xF72, 0xF80, 0x1B34, 0x1161, 0x11A8]
BASES = list(range(0x41, 0x7B)) + [
    0xE9, 0xFB2C, 0xFB2D, 0x1E9B, 0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01, 0x212B, 0x2126, 0x344, 0xF73, 0xF75,
    0x958, 0x2ADC, 0x1F82, 0x1FB7, 0x3071, 0x304B, 0xFB01, 0x2460, 0x33C4, 0xFF21, 0x1D400, 0xBD, 0x340, 0x341,
    0x343, 0x374, 0x37E, 0x387, 0x1E0A, 0x1E0C, 0x112, 0x1D5, 0x1FEE, 0xFDFA, 0x3200, 0x1F1A, 0xB47, 0xB3E,
    0xB57, 0x9C7, 0x9BE, 0x1B05, 0x1B35]


def _char_tokenizer(form: str, chars: set[str]) -> dict:
    """A tokenizer.json with only a normalizer, one pre-token per normalized char, and every char a
    token: encode's offsets are then the input span of each normalized char."""
    vocab = {c: i for i, c in enumerate(sorted(chars))}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": []}
    d = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": {"type": form},
         "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
         "post_processor": None, "decoder": None, "model": model}
    return d


@pytest.mark.parametrize("form", ["NFC", "NFD", "NFKC", "NFKD"])
def test_alignment_equals_hf(form):
    rng = random.Random(0)
    texts = ["".join(chr(rng.choice(BASES if rng.random() < 0.5 else MARKS)) for _ in range(rng.randint(1, 8)))
             for _ in range(2000)]
    texts += ["\ufb2c\u0614", "e\u0301", "\u00e9", "a\u0323\u0302", "a\u0302\u0323", "\u1100\u1161\u11a8", "\ufb01"]
    d = _char_tokenizer(form, {c for t in texts for c in unicodedata.normalize(form, t)})
    hf, ours = HFTokenizer.from_str(json.dumps(d)), Tokenizer.from_hf_dict(d)
    for text in texts:
        out, spans = normalize_aligned(text, form, [(i, i + 1) for i in range(len(text))])
        want = hf.encode(text)
        assert out == "".join(want.tokens) == unicodedata.normalize(form, text), ascii(text)
        assert spans == want.offsets, ascii(text)
        got = ours.encode_with_offsets(text)
        assert (got.ids, got.offsets) == (want.ids, want.offsets), ascii(text)
