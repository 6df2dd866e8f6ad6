"""Byte-level BPE GGUFs under the `tokenizer.ggml.pre` names of the target families: scratchlm gives llama.cpp's
ids on a multilingual corpus, and llama.cpp's default BOS for Llama-3-style names without add_bos_token."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gguf_helpers import tokenizer_metadata
from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.tokenizer_metadata import pretrained_from_gguf, tokenizer_config_from_gguf
from spm_helpers import CORPUS, LlamaCpp, random_texts, write_metadata_gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# the names llama.cpp gives Phi-4-mini (gpt-4o), Phi-4 / OLMo-2 / Granite 4 (dbrx), Granite 3 (refact),
# Mistral-Nemo (tekken), Llama-3 (llama-bpe), Qwen2 (qwen2), SmolLM (smollm), and aliases of those regexes
# (llama4, kanana2, talkie: gpt-4o's regex, not run again: llama.cpp runs it slowly)
NAMES = ["gpt-4o", "tekken", "dbrx", "refact", "llama-bpe", "qwen2", "smollm", "hunyuan", "mellum2",
         "granite-docling"]
CASES = ["HelloWorld camelCase snake_case SCREAMING_CASE ÉCOLE école ÀÉÎõü ǅungla", "I'M you're THEY'LL we'd it's",
         "path/to/file.txt\n/usr/bin//x", "1234567 12 3.14159 ٣٤٥٦", "a  b   c\n\n\nd\t\te \r\n f",
         "<|im_start|>user\nhi<|im_end|>\n", "Ωmega Σigma ǈǉ ﬁ", "x\x1cy\x85z\u2028w"]


@pytest.fixture(scope="module")
def byte_level_bpe(shared_data):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = (shared_data / "tinyshakespeare.txt").read_text()[:40000].split("\n") + CORPUS * 3 + CASES * 3
    tok.train_from_iterator(text, trainer)
    return tok


@pytest.mark.parametrize("pre", NAMES)
def test_pre_tokenizer_names_match_llama_cpp(tmp_path, byte_level_bpe, pre):
    meta = tokenizer_metadata(byte_level_bpe, pre, bos="<|endoftext|>", eos="<|im_end|>")
    path = write_metadata_gguf(tmp_path / "t.gguf", meta)
    tok = pretrained_from_gguf(read_gguf(path).metadata).tokenizer
    ref = LlamaCpp(path)
    try:
        for text in CORPUS + CASES + random_texts("aA É'sS/1 \n\tx中😀.", 40, seed=2):
            assert tok.encode(text) == ref.tokenize(text, False, True), (pre, text)
            assert tok.encode_ordinary(text) == ref.tokenize(text, False, False), (pre, text)
    finally:
        ref.close()


@pytest.mark.parametrize("pre,adds", [("llama-bpe", True), ("tekken", True), ("gpt-4o", False), ("qwen2", False)])
def test_default_bos_without_add_bos_token(tmp_path, byte_level_bpe, pre, adds):
    meta = tokenizer_metadata(byte_level_bpe, pre, bos="<|endoftext|>", eos="<|im_end|>")
    del meta["tokenizer.ggml.add_bos_token"]
    path = write_metadata_gguf(tmp_path / "t.gguf", meta)
    metadata = read_gguf(path).metadata
    assert tokenizer_config_from_gguf(metadata)["add_bos_token"] is adds
    tok = pretrained_from_gguf(metadata).tokenizer
    ref = LlamaCpp(path)
    try:
        want = ref.tokenize("Hello world", True, True)
    finally:
        ref.close()
    assert tok.encode("Hello world", add_special_tokens=True) == want
    assert (want[0] == byte_level_bpe.token_to_id("<|endoftext|>")) is adds
