"""A realistic SentencePiece vocabulary: a byte-fallback sentencepiece BPE trained here, converted to GGUF as
llama.cpp's converter does. scratchlm's tokenizer gives llama.cpp's ids and decoded bytes on a multilingual
corpus (every add_bos x special x render combination), and HF `tokenizers` running the exported
tokenizer.json gives the same ids and text."""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
import pytest
from tokenizers import Tokenizer as HFTokenizer

from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.tokenizer_metadata import (pretrained_from_gguf, stop_token_ids_from_gguf,
                                                      tokenizer_config_from_gguf, tokenizer_json_from_gguf)
from spm_helpers import (CONTROL, CORPUS, USER_DEFINED, LlamaCpp, mismatches, ours, random_texts,
                         sentencepiece_vocab, train_sentencepiece, write_spm_gguf)

USER, CONTROLS = ["<tool>", "</tool>"], ["[INST]", "[/INST]"]
RUNS = ["▁" * k for k in range(2, 17) if k != 15]  # Llama-2 / Mistral's whitespace runs, all at score -1e9


@pytest.fixture(scope="module")
def trained(shared_data):
    lines = (shared_data / "tinyshakespeare.txt").read_text()[:60000].split("\n")
    lines += (shared_data / "corpus.en").read_text()[:30000].split("\n") + CORPUS * 5
    lines += Path(__file__).read_text().split("\n")
    return sentencepiece_vocab(train_sentencepiece(lines, 3000, USER, CONTROLS), USER)


@pytest.fixture(scope="module")
def texts(shared_data):
    stories = (shared_data / "tinystories_sample.txt").read_text()[:8000].split("\n")
    return CORPUS + stories[:60] + random_texts(" \n\tab<>/s[]INSTtool中é🦙▁", 150, seed=1)


def _variant(trained, name: str):
    """(tokens, scores, types, writer kwargs): the trained vocab as Llama-2 ("llama"), with Llama-2's tied
    whitespace runs ("runs"), or Gemma-style ("gemma": no space prefix, whitespace user-defined tokens, an
    end-of-turn control token, BOS/EOS flags written out)."""
    tokens, scores, types = (list(x) for x in trained)
    if name == "runs":
        for run in RUNS:
            if run in tokens:
                scores[tokens.index(run)] = -1e9
            else:
                tokens.append(run), scores.append(-1e9), types.append(1)
        return tokens, scores, types, {}
    if name == "gemma":
        for text, score, kind in (("  ", 0.0, USER_DEFINED), ("   ", 0.0, USER_DEFINED), ("\n\n", 0.0, USER_DEFINED),
                                  ("<start_of_turn>", 0.0, CONTROL), ("<end_of_turn>", 0.0, CONTROL)):
            if text in tokens:  # a learned piece Gemma's tokenizer lists as an added token
                types[tokens.index(text)] = kind
            else:
                tokens.append(text), scores.append(score), types.append(kind)
        return tokens, scores, types, {"add_space_prefix": False, "add_bos": True, "add_eos": False}
    return tokens, scores, types, {}


@pytest.mark.parametrize("name", ["llama", "runs", "gemma"])
def test_trained_vocab_matches_llama_cpp_and_hf_tokenizers(tmp_path, trained, texts, name):
    tokens, scores, types, flags = _variant(trained, name)
    path = write_spm_gguf(tmp_path / "v.gguf", tokens, scores, types, **flags)
    metadata = read_gguf(path).metadata
    tok = pretrained_from_gguf(metadata).tokenizer
    ref = LlamaCpp(path)
    try:
        assert mismatches(tok, ref, texts) == []
    finally:
        ref.close()
    # the exported tokenizer.json is exact for these vocabularies (the check says so), and HF agrees
    assert tok.hf_form_risks()["encode"] == []
    spec = tokenizer_json_from_gguf(metadata)
    assert spec == tok.to_hf_dict()
    hf = HFTokenizer.from_str(json.dumps(spec))
    for text in texts:
        for add_bos in (False, True):
            for special in (False, True):
                hf.encode_special_tokens = not special
                ids = hf.encode(text, add_special_tokens=add_bos).ids
                assert ids == ours(tok, text, add_bos, special), (text, add_bos, special)
        ids = tok.encode(text)
        assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids), text
    lines = [t + "\n" for t in texts]
    assert list(tok.encode_iterable(lines)) == tok.encode("".join(lines))


def test_config_bos_eos_defaults_and_the_loader_entry_point(tmp_path, trained):
    tokens, scores, types = trained
    path = write_spm_gguf(tmp_path / "v.gguf", tokens, scores, types, bos=None, eos=None, unk=None,
                          extra={"tokenizer.chat_template": "{{ messages[0]['content'] }}"})
    metadata = read_gguf(path).metadata
    config = tokenizer_config_from_gguf(metadata)
    # llama.cpp's SentencePiece defaults: bos 1, eos 2, unk 0, add_bos true, add_eos false
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    assert stop_token_ids_from_gguf(metadata) == [2]
    from scratchlm.load.tokenizers import gguf_tokenizer

    tok = gguf_tokenizer(metadata)
    ref = LlamaCpp(path)
    try:
        for text in ("Hello world", " [INST] hi [/INST]", ""):
            assert tok.encode(text, add_special_tokens=True) == ref.tokenize(text, True, True)
    finally:
        ref.close()
    assert tok.chat_template is not None and tok.special_token_ids["<s>"] == 1


def test_stop_ids_are_llama_cpps_end_of_generation_set(tmp_path):
    """stop_token_ids_from_gguf = the tokens llama.cpp's llama_vocab_is_eog says end a generation (Gemma's
    <end_of_turn> without an eot id in the file, <|endoftext|> beside <|im_end|>, the eos), eos first."""
    from spm_helpers import base_vocab

    tokens, scores, types = base_vocab()
    extra_tokens = ["<start_of_turn>", "<end_of_turn>", "<|im_end|>", "<|endoftext|>", "▁a", "▁b"]
    tokens += extra_tokens
    scores += [0.0, 0.0, 0.0, 0.0, -1.0, -2.0]
    types += [CONTROL, CONTROL, USER_DEFINED, CONTROL, 1, 1]
    path = write_spm_gguf(tmp_path / "eog.gguf", tokens, scores, types, name="gemma-like")
    metadata = read_gguf(path).metadata
    ref = LlamaCpp(path)
    try:
        vocab = ref.llm._model.vocab
        want = {i for i in range(len(tokens)) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    finally:
        ref.close()
    got = stop_token_ids_from_gguf(metadata)
    assert got[0] == 2 and set(got) == want and len(got) == len(want)
    assert {tokens[i] for i in got} == {"</s>", "<end_of_turn>", "<|im_end|>", "<|endoftext|>"}
