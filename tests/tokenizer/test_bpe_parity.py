"""Parity with the trusted tokenizers: GPT-2 vs tiktoken (built offline), HF tokenizer.json both ways
vs `tokenizers`/`transformers`, and the tiktoken fast path == the from-scratch encoder."""

from __future__ import annotations

import pytest

from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer
from scratchlm.tokenizer.hf_files import load_hf_tokenizer_json, save_hf_tokenizer_json

from .conftest import MULTILINGUAL

SPECIALS_TEXT = "a<|endoftext|>b<|endoftext|><|endoftext|> <|im_start|>user\nhi<|im_end|>\n<|endoftext"


@pytest.fixture(scope="module")
def texts(shared_data) -> dict[str, str]:
    return {
        "shakespeare": (shared_data / "tinyshakespeare.txt").read_text(encoding="utf-8"),
        "corpus.en": (shared_data / "corpus.en").read_text(encoding="utf-8"),
        "tinystories": (shared_data / "tinystories_sample.txt").read_text(encoding="utf-8"),
        "multilingual": "\n".join(MULTILINGUAL),
        "specials": SPECIALS_TEXT,
    }


def test_gpt2_reference_matches_tiktoken(gpt2_tok, tiktoken_gpt2, texts):
    for name, text in texts.items():
        if name == "shakespeare":
            text = text[:150_000]  # the pure-Python encoder on 50k merges; the fast path covers all of it
        want = tiktoken_gpt2.encode(text, allowed_special="all")
        assert gpt2_tok.encode(text) == want, name
        assert gpt2_tok.decode(want) == text
    assert gpt2_tok.vocab_size == tiktoken_gpt2.n_vocab == 50257


def test_gpt2_fast_matches_tiktoken_and_reference(gpt2_tok, tiktoken_gpt2, texts):
    fast = Tokenizer(gpt2_tok.vocab, gpt2_tok.merges, gpt2_tok.special_tokens, impl="tiktoken")
    for name, text in texts.items():
        assert fast.encode(text) == tiktoken_gpt2.encode(text, allowed_special="all"), name
    assert fast.encode(texts["shakespeare"][:150_000]) == gpt2_tok.encode(texts["shakespeare"][:150_000])


@pytest.mark.parametrize("name", ["shakespeare_tok", "multilingual_tok"])
def test_trained_fast_path_equals_reference(request, texts, name):
    ref = request.getfixturevalue(name)
    fast = Tokenizer(ref.vocab, ref.merges, ref.special_tokens, impl="tiktoken")
    for key, text in texts.items():
        assert fast.encode(text) == ref.encode(text), key
    assert fast.encode_ordinary(SPECIALS_TEXT) == ref.encode_ordinary(SPECIALS_TEXT)
    lone = "a\ud800b \udfff!"  # lone surrogates: both encode them as U+FFFD
    assert fast.encode(lone) == ref.encode(lone) == ref.encode("a\ufffdb \ufffd!")


def test_fast_path_refuses_ids_out_of_merge_order(shakespeare_tok):
    vocab = dict(shakespeare_tok.vocab)
    a, b = shakespeare_tok.vocab_size - 1, shakespeare_tok.vocab_size - 2
    vocab[a], vocab[b] = vocab[b], vocab[a]  # last two merges swap ids
    assert Tokenizer(vocab, shakespeare_tok.merges, shakespeare_tok.special_tokens).encode("the king") is not None
    with pytest.raises(ValueError, match="needs ids in merge order"):
        Tokenizer(vocab, shakespeare_tok.merges, shakespeare_tok.special_tokens, impl="tiktoken")


@pytest.mark.parametrize("name", ["shakespeare_tok", "multilingual_tok", "gpt2_tok"])
def test_export_loads_in_hf_tokenizers_with_same_ids(request, tmp_path, texts, name):
    from tokenizers import Tokenizer as HFTokenizer

    tok = request.getfixturevalue(name)
    save_hf_tokenizer_json(tok, tmp_path / "tokenizer.json")
    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for key, text in texts.items():
        text = text[:100_000]
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False).ids == ids, key
        assert hf.decode(ids, skip_special_tokens=False) == text
    back = load_hf_tokenizer_json(tmp_path / "tokenizer.json")
    assert back.vocab == tok.vocab and back.merges == tok.merges and back.special_token_ids == tok.special_token_ids


def test_import_hf_trained_tokenizer(tmp_path, shared_data, texts):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=DEFAULT_SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train([str(shared_data / "corpus.en"), str(shared_data / "tinystories_sample.txt")], trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = load_hf_tokenizer_json(tmp_path / "tokenizer.json")
    fast = load_hf_tokenizer_json(tmp_path / "tokenizer.json", impl="tiktoken")
    assert ours.vocab_size == hf.get_vocab_size()
    for key, text in texts.items():
        text = text[:100_000]
        want = hf.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == want, key
        assert fast.encode(text) == want, key
        assert ours.decode(want) == hf.decode(want, skip_special_tokens=False)


def test_export_loads_in_transformers_with_chat_template(shakespeare_tok, tmp_path):
    from transformers import PreTrainedTokenizerFast

    from scratchlm.tokenizer.chat.render import render_chat

    save_hf_tokenizer_json(shakespeare_tok, tmp_path / "tokenizer.json")
    chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), chat_template=chatml)
    text = "First Citizen:\nBefore we proceed any further, hear me speak.<|endoftext|>"
    assert hf(text, add_special_tokens=False)["input_ids"] == shakespeare_tok.encode(text)
    messages = [{"role": "system", "content": "You are Hamlet."}, {"role": "user", "content": "To be?"},
                {"role": "assistant", "content": "Or not to be: that is the question."}]
    for gen in (False, True):
        want = hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert render_chat(shakespeare_tok, messages, add_generation_prompt=gen)[0] == list(want)
