"""GGUF tokenizer metadata -> tokenizer.json: the same ids as the HF tokenizer the file was written from."""

from __future__ import annotations

import json

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from gguf_helpers import tokenizer_metadata, write_metadata_only
from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.tokenizer_metadata import (stop_token_ids_from_gguf, tokenizer_config_from_gguf,
                                             tokenizer_json_from_gguf)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# the pre-tokenizer regexes of the real models' tokenizer.json files (HF spelling, not llama.cpp's)
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
TEXTS = [
    "Hello world, What is the capital of France?", "I'M SURE you're right; THEY'LL see. It's 2024-11-23, 1234567 units.",
    "def main():\n    return {'a': [1, 2, 3]}\n\n\n", "  leading and   inner   spaces \t\ttabs\r\nwindows",
    "emoji 🤗🚀 and CJK 中文字符 and Arabic مرحبا and combining é", "<|im_start|>user\nhi there<|im_end|>\n",
    "numbers 3.14159 and 1,000,000 and ٣٤٥", "",
]


def hf_style_tokenizer(shared_data, style: str) -> Tokenizer:
    """A byte-level BPE trained locally in a real model's pre-tokenizer style (HF tokenizers)."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=style == "gpt2")
    if style == "gpt2":
        pre = byte_level
    elif style == "smollm":
        pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        regex = {"qwen2": QWEN2, "llama3": LLAMA3}[style]
        pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = (shared_data / "tinyshakespeare.txt").read_text()[:60000] + "\n".join(TEXTS) * 3
    tok.train_from_iterator(text.split("\n"), trainer)
    return tok


@pytest.mark.parametrize("style,pre", [("qwen2", "qwen2"), ("llama3", "llama-bpe"), ("gpt2", "gpt-2"),
                                       ("smollm", "smollm")])
def test_tokenizer_json_gives_the_source_tokenizers_ids(tmp_path, shared_data, style, pre):
    source = hf_style_tokenizer(shared_data, style)
    meta = tokenizer_metadata(source, pre, bos="<|im_start|>", eos="<|im_end|>")
    path = write_metadata_only(tmp_path / "t.gguf", "llama", meta)
    spec = tokenizer_json_from_gguf(read_gguf(path).metadata)
    ours = Tokenizer.from_str(json.dumps(spec))
    for text in TEXTS:
        assert ours.encode(text).ids == source.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


def test_config_specials_template_and_bos_post_processor(tmp_path, shared_data):
    source = hf_style_tokenizer(shared_data, "qwen2")
    template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    meta = tokenizer_metadata(source, "qwen2", chat_template=template, bos="<|im_start|>", eos="<|im_end|>",
                              add_bos=True)
    meta["tokenizer.ggml.eot_token_id"] = source.token_to_id("<|endoftext|>")
    metadata = read_gguf(write_metadata_only(tmp_path / "t.gguf", "qwen2", meta)).metadata
    config = tokenizer_config_from_gguf(metadata)
    assert config["bos_token"] == "<|im_start|>" and config["eos_token"] == "<|im_end|>"
    assert config["chat_template"] == template and config["add_bos_token"] is True
    assert stop_token_ids_from_gguf(metadata) == [source.token_to_id("<|im_end|>"), source.token_to_id("<|endoftext|>")]
    ours = Tokenizer.from_str(json.dumps(tokenizer_json_from_gguf(metadata)))
    assert ours.encode("hi").ids == [source.token_to_id("<|im_start|>")] + source.encode("hi").ids


def test_unsupported_tokenizers_are_refused(tmp_path, shared_data):
    meta = tokenizer_metadata(hf_style_tokenizer(shared_data, "gpt2"), "chameleon")
    metadata = read_gguf(write_metadata_only(tmp_path / "a.gguf", "llama", meta)).metadata
    with pytest.raises(ValueError, match="tokenizer.ggml.pre='chameleon' is not supported"):
        tokenizer_json_from_gguf(metadata)
    metadata["tokenizer.ggml.model"] = "bert"
    with pytest.raises(ValueError, match="tokenizer.ggml.model='bert' is not supported"):
        tokenizer_json_from_gguf(metadata)
