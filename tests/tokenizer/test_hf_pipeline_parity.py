"""The from-scratch pipeline against HF `tokenizers`, style by style (GPT-2, Llama-3, Qwen2 + added tokens
with every flag, Llama-2 legacy, Mistral, Gemma, Metaspace, a kitchen sink of the remaining stages):
identical ids with and without the post-processor, identical decode (with and without special tokens),
identical char offsets, and a tokenizer.json export equal to HF's own serialization, on >= 2000 lines."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer

from scratchlm.tokenizer import Tokenizer

from . import hf_styles

STYLES = ["gpt2", "llama3", "qwen2_flags", "llama2", "mistral", "gemma", "metaspace", "kitchen_flags"]


@pytest.fixture(scope="module")
def build(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("styles")
    cache: dict[str, tuple[HFTokenizer, Tokenizer]] = {}

    def get(name: str) -> tuple[HFTokenizer, Tokenizer]:
        if name not in cache:
            hf = hf_styles.build(name, shared_data, tmp)
            cache[name] = hf, Tokenizer.from_hf_dict(json.loads(hf.to_str()))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def lines(shared_data) -> list[str]:
    out = hf_styles.sample_lines(shared_data)
    assert len(out) >= 2000
    return out


@pytest.mark.parametrize("name", STYLES)
def test_ids_and_decode_match_hf(build, lines, name):
    hf, ours = build(name)
    for k, line in enumerate(lines):
        want = hf.encode(line, add_special_tokens=False).ids
        assert ours.encode(line) == want, (name, line)
        if k % 3 == 0:  # the post-processor only adds tokens around the text: a third of the lines suffice
            assert ours.encode(line, add_special_tokens=True) == hf.encode(line).ids, (name, line)
        assert ours.decode(want) == hf.decode(want, skip_special_tokens=False), (name, line)
        assert ours.decode(want, skip_special_tokens=True) == hf.decode(want, skip_special_tokens=True), (name, line)


@pytest.mark.parametrize("name", STYLES)
def test_offsets_and_tokens_match_hf(build, lines, name):
    hf, ours = build(name)
    for line in lines[::4]:
        want = hf.encode(line)
        got = ours.encode_with_offsets(line, add_special_tokens=True)
        assert (got.ids, got.offsets, got.tokens, got.type_ids) == (want.ids, want.offsets, want.tokens, want.type_ids), line


@pytest.mark.parametrize("name", STYLES)
def test_export_equals_hf_serialization_and_loads_back(build, lines, name):
    hf, ours = build(name)
    exported = ours.to_hf_dict()
    assert exported == json.loads(hf.to_str())
    again = HFTokenizer.from_str(json.dumps(exported))
    for line in lines[::10]:
        assert again.encode(line).ids == hf.encode(line).ids


@pytest.mark.parametrize("name", ["llama3", "llama2", "mistral", "kitchen_flags"])
def test_pair_templates_match_hf(build, name):
    hf, ours = build(name)
    pairs = [("Hello there", "General Kenobi!"), ("", "x"), ("日本 🎉", "  spaced  out  "), ("<s>a", "b</s>")]
    for a, b in pairs:
        want = hf.encode(a, b)
        got = ours.encode_with_offsets(a, b, add_special_tokens=True)
        assert (got.ids, got.type_ids, got.offsets) == (want.ids, want.type_ids, want.offsets)
        assert ours.encode(a, b) == hf.encode(a, b, add_special_tokens=False).ids


def test_unpaired_surrogates_are_refused_as_hf_refuses_them(build):
    hf, ours = build("qwen2_flags")
    for text in ["a\ud800b", "\udfff", "ok \ud83d\ude00 pair written as two code points"]:
        with pytest.raises(TypeError):
            hf.encode(text)
        with pytest.raises(ValueError, match="unpaired surrogate .* at index"):
            ours.encode(text)


def _variants():
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

    return {
        "whitespace_nfd": lambda t: (setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
                                     setattr(t, "normalizer", normalizers.NFD())),
        "metaspace_never": lambda t: (setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace(prepend_scheme="never")),
                                      setattr(t, "decoder", decoders.Metaspace(prepend_scheme="never"))),
        "byte_level_prefix": lambda t: (setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
                                        setattr(t, "post_processor", processors.ByteLevel(trim_offsets=True))),
        "roberta": lambda t: setattr(t, "post_processor", processors.RobertaProcessing(("</s>", 2), ("<s>", 1))),
        "punctuation_behaviors": lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([
            pre_tokenizers.Punctuation("merged_with_previous"), pre_tokenizers.Punctuation("contiguous"),
            pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Punctuation("removed")])),
        "regex_replace_lowercase": lambda t: setattr(t, "normalizer", normalizers.Sequence([
            normalizers.Lowercase(), normalizers.Replace(Regex(r"[0-9]+"), "#"), normalizers.Strip(left=True, right=False),
            normalizers.NFKC()])),
    }


@pytest.mark.parametrize("variant", ["whitespace_nfd", "metaspace_never", "byte_level_prefix", "roberta",
                                     "punctuation_behaviors", "regex_replace_lowercase"])
def test_component_variants_match_hf(build, lines, variant):
    """Stages and options the model styles above do not use, swapped into a trained tokenizer."""
    base_name = "gpt2" if variant == "byte_level_prefix" else "metaspace"
    hf = HFTokenizer.from_str(build(base_name)[0].to_str())
    _variants()[variant](hf)
    ours = Tokenizer.from_hf_dict(json.loads(hf.to_str()))
    assert ours.to_hf_dict() == json.loads(hf.to_str())
    for line in lines[::5]:
        want = hf.encode(line)
        got = ours.encode_with_offsets(line, add_special_tokens=True)
        assert (got.ids, got.offsets) == (want.ids, want.offsets), line
        assert ours.decode(want.ids) == hf.decode(want.ids, skip_special_tokens=False), line
    pair = hf.encode("Hello, world!", "Second one.")
    assert ours.encode_with_offsets("Hello, world!", "Second one.", add_special_tokens=True).ids == pair.ids
