"""tokenizer.json components and options scratchlm does not implement are refused naming them (never a
silently different tokenizer), and malformed files are clear errors."""

from __future__ import annotations

import copy
import json

import pytest

from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.json_fields import UnsupportedTokenizerFeature


@pytest.fixture(scope="module")
def base(shakespeare_tok) -> dict:
    return shakespeare_tok.to_hf_dict()


def _with(base: dict, **changes) -> dict:
    d = copy.deepcopy(base)
    for path, value in changes.items():
        *keys, last = path.split("__")
        node = d
        for k in keys:
            node = node[k]
        node[last] = value
    return d


@pytest.mark.parametrize("changes,message", [
    ({"model__type": "WordPiece"}, "model type 'WordPiece' is not supported"),
    ({"model__type": "Unigram"}, "model type 'Unigram' is not supported"),
    ({"model__dropout": 0.1}, r"model.dropout=0.1 \(BPE dropout"),
    ({"model__cache_capacity": 10}, r"option\(s\) \['cache_capacity'\]"),
    ({"normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAA"}}, "normalizer type 'Precompiled' is not supported"),
    ({"normalizer": {"type": "BertNormalizer"}}, "normalizer type 'BertNormalizer'"),
    ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "StripAccents"}]}},
     r"normalizer.normalizers\[1\] type 'StripAccents'"),
    ({"pre_tokenizer": {"type": "UnicodeScripts"}}, "pre_tokenizer type 'UnicodeScripts' is not supported"),
    ({"pre_tokenizer": {"type": "BertPreTokenizer"}}, "pre_tokenizer type 'BertPreTokenizer'"),
    ({"pre_tokenizer__prefix_hint": True}, r"ByteLevel has option\(s\) \['prefix_hint'\]"),
    ({"decoder": {"type": "WordPiece", "prefix": "##"}}, "decoder type 'WordPiece' is not supported"),
    ({"decoder": {"type": "CTC"}}, "decoder type 'CTC'"),
    ({"post_processor": {"type": "NoSuchProcessor"}}, "post_processor type 'NoSuchProcessor'"),
    ({"version": "2.0"}, "version '2.0' is unknown"),
])
def test_unsupported_parts_are_named(base, changes, message):
    with pytest.raises(UnsupportedTokenizerFeature, match=message):
        Tokenizer.from_hf_dict(_with(base, **changes))


@pytest.mark.parametrize("changes,message", [
    ({"model__merges": [["a"]]}, r"model.merges\[0\] \['a'\] is not a pair"),
    ({"model__merges": [["zz", "q"]]}, "merge #0 .* not in the vocab"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated", "invert": False}},
     "does not compile"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Sideways", "invert": False}},
     "behavior 'Sideways' is not one of"),
    ({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"}},
     "prepend_scheme 'sometimes' is not one of"),
    ({"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
                         "pair": [], "special_tokens": {}}}, "special token '<s>' is not in its special_tokens"),
    ({"added_tokens": [{"id": 5, "content": ""}]}, "content '' must be a non-empty string"),
])
def test_malformed_parts_are_clear_errors(base, changes, message):
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_hf_dict(_with(base, **changes))


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_hf_json(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(ValueError, match="is not valid JSON"):
        Tokenizer.from_hf_json(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="must be a JSON object with a 'model'"):
        Tokenizer.from_hf_dict(json.loads("[1, 2]"))


def test_truncation_and_padding_are_kept_but_not_applied(base):
    """transformers turns them off too; they travel back on export."""
    trunc = {"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0}
    tok = Tokenizer.from_hf_dict(_with(base, truncation=trunc))
    assert len(tok.encode("First Citizen: before we proceed any further")) > 3
    assert tok.to_hf_dict()["truncation"] == trunc
