"""SmolLM2's real tokenizer (from the GGUF fixture; its byte-level vocab lacks 21 single-byte tokens) against
the tokenizer transformers builds from the same file: ids, decode, export, fast path, chat template.

Two references: transformers' GGUF conversion itself (GPT-2's ByteLevel regex), for the tokenizer built from
its tokenizer.json; and the same vocab with SmolLM2's published pre-tokenizer (Digits one by one, then
ByteLevel) for the tokenizer scratchlm builds from the file's metadata, which follows llama.cpp's "smollm"
pre-tokenizer (transformers' GGUF conversion has no entry for it and does not split digits)."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.load.tokenizers import gguf_tokenizer
from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.byte_level import bytes_to_unicode
from scratchlm.tokenizer.hf_files import tokenizer_from_json

from . import hf_styles

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "What is 2+2? 🤔"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "Merci! Et 日本語?"}]


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """transformers' tokenizer of the GGUF file (its own GGUF tokenizer conversion) and its config."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    arch, tokenizer_dict, config = get_gguf_tokenizer(str(smollm2_gguf))
    backend, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    return backend, config


@pytest.fixture(scope="module")
def ours(smollm2_gguf):
    return gguf_tokenizer(read_gguf(smollm2_gguf).metadata)


@pytest.fixture(scope="module")
def published(reference):
    """The GGUF vocab with SmolLM2's published pre-tokenizer: Digits(individual_digits) + ByteLevel."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

    hf = HFTokenizer.from_str(reference[0].to_str())
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return hf


def test_vocab_lacks_single_bytes_and_ids_decode_match(reference, published, ours, shared_data):
    backend, _ = reference
    missing = [b for b, c in bytes_to_unicode().items() if c not in ours.model.vocab]
    assert len(missing) == 21
    from_json = tokenizer_from_json(json.loads(backend.to_str()))
    lines = hf_styles.sample_lines(shared_data) + ["\x04\x06\x13 control bytes", "plane 4: \U00040000\U0008FFFF"]
    for line in lines:
        want = backend.encode(line, add_special_tokens=False).ids
        assert from_json.encode(line) == want, line
        assert from_json.decode(want) == backend.decode(want, skip_special_tokens=False), line
        assert ours.encode(line) == published.encode(line, add_special_tokens=False).ids, line
    assert from_json.to_hf_dict() == json.loads(backend.to_str())


def test_fast_path_with_missing_bytes(reference, shared_data):
    backend, _ = reference
    fast = Tokenizer.from_hf_dict(json.loads(backend.to_str()), impl="tiktoken")
    text = "\n".join(hf_styles.sample_lines(shared_data)) + "\x04 \U00040000"
    assert fast.encode(text) == backend.encode(text, add_special_tokens=False).ids


def test_chat_template_equals_transformers(reference, ours):
    backend, config = reference
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=config["chat_template"],
                                   bos_token=config["bos_token"], eos_token=config["eos_token"])
    assert ours.chat_template is not None
    for gen in (False, True):
        assert ours.chat_template.render(CHAT, add_generation_prompt=gen) == fast.apply_chat_template(
            CHAT, add_generation_prompt=gen, tokenize=False)
        assert ours.chat_template.encode(ours, CHAT, gen)[0] == fast.apply_chat_template(
            CHAT, add_generation_prompt=gen)["input_ids"]
