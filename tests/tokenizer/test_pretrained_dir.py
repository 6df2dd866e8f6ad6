"""Entry points (a) and (b): a model directory saved by transformers, and a tokenizer.json dict in memory,
against what transformers' AutoTokenizer reads from the same files."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.hf_files import load_pretrained_tokenizer, pretrained_from_json, tokenizer_from_json

from . import hf_styles

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋 <|im_end|>"},
            {"role": "assistant", "content": "Hello."}]


@pytest.fixture(scope="module")
def qwen_dir(shared_data, tmp_path_factory):
    """A Qwen2-style tokenizer saved by transformers with bos/eos/pad, an extra named token and ChatML."""
    tmp = tmp_path_factory.mktemp("qwen")
    hf = hf_styles.build("qwen2", shared_data, tmp)
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token="<|im_start|>", unk_token="<unk-not-in-vocab>", chat_template=CHATML)
    fast.save_pretrained(tmp / "model")
    return tmp / "model"


@pytest.fixture(scope="module")
def llama_dir(shared_data, tmp_path_factory):
    """A Llama-2-style tokenizer (BOS/EOS template) saved with a chat_template.jinja file."""
    tmp = tmp_path_factory.mktemp("llama")
    fast = PreTrainedTokenizerFast(tokenizer_object=hf_styles.build("llama2", shared_data, tmp), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.chat_template = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}"
    fast.save_pretrained(tmp / "model")
    assert (tmp / "model" / "chat_template.jinja").is_file()
    return tmp / "model"


@pytest.mark.parametrize("fixture", ["qwen_dir", "llama_dir"])
def test_model_dir_matches_transformers(request, fixture):
    directory = request.getfixturevalue(fixture)
    hf = AutoTokenizer.from_pretrained(directory)
    bundle = load_pretrained_tokenizer(directory)
    st = bundle.special_tokens
    assert st.named == hf.special_tokens_map
    for name, value in hf.special_tokens_map.items():
        assert getattr(st, f"{name}_id") == hf.convert_tokens_to_ids(value), name
    text = "Hello <|im_end|> <s> world </s> 日本 <unk-not-in-vocab>!"
    assert bundle.tokenizer.encode(text, add_special_tokens=True) == hf(text)["input_ids"]
    assert bundle.tokenizer.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert st.add_bos_token == (hf("x")["input_ids"][0] == hf.bos_token_id)
    assert bundle.chat_template.render(MESSAGES, add_generation_prompt=True) == hf.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)
    ids, _ = bundle.encode_chat(MESSAGES)
    assert ids == hf.apply_chat_template(MESSAGES)["input_ids"]


def test_llama_dir_adds_bos_and_eos(llama_dir):
    st = load_pretrained_tokenizer(llama_dir).special_tokens
    assert (st.add_bos_token, st.add_eos_token, st.bos_token, st.eos_token_id) == (True, True, "<s>", 2)


def test_named_special_token_missing_from_tokenizer_json_is_added(qwen_dir):
    """transformers adds a named special token that tokenizer.json lacks; so do we (same id, never split)."""
    hf = AutoTokenizer.from_pretrained(qwen_dir)
    tok = load_pretrained_tokenizer(qwen_dir).tokenizer
    unk = hf.convert_tokens_to_ids("<unk-not-in-vocab>")
    assert tok.special_token_ids["<unk-not-in-vocab>"] == unk and tok.encode("a<unk-not-in-vocab>b").count(unk) == 1


def test_from_json_dict_with_partial_byte_vocab_and_stop_ids(shared_data, tmp_path):
    """(b): a GGUF-style dict whose byte-level vocab lacks single-byte tokens (as SmolLM2's lacks 21)."""
    hf = hf_styles.build("qwen2", shared_data, tmp_path)
    d = json.loads(hf.to_str())
    dropped = ["Ą", "Ć", "ñ", "÷"]  # bytes 0x04, 0x06, 0xF1, 0xF7
    for s in dropped:
        del d["model"]["vocab"][s]
    d["model"]["merges"] = [m for m in d["model"]["merges"] if not any(c in "".join(m) for c in dropped)]
    ref = type(hf).from_str(json.dumps(d))
    tok = tokenizer_from_json(d)
    for text in ["a\x04b\x06c", "plane 4 \U00040000 and ÷ ñ", "plain text"]:
        assert tok.encode(text) == ref.encode(text).ids
    bundle = pretrained_from_json(d, {"eos_token": "<|im_end|>", "chat_template": CHATML})
    assert bundle.stop_token_ids == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert isinstance(bundle.tokenizer, Tokenizer) and bundle.chat_template is not None


def test_scratchlm_dir_loads_with_chatml_or_its_template(shakespeare_tok, tmp_path):
    shakespeare_tok.save(tmp_path)
    bundle = load_pretrained_tokenizer(tmp_path)
    assert bundle.chat_template is None and bundle.tokenizer.vocab == shakespeare_tok.vocab
    ids, mask = bundle.encode_chat(MESSAGES)
    assert ids[0] == shakespeare_tok.special_token_ids["<|im_start|>"] and sum(mask) > 0
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "chat_template": template}))
    bundle = load_pretrained_tokenizer(tmp_path)
    assert bundle.tokenizer.chat_template.render(MESSAGES[:1]) == "[system] Be brief.<|endoftext|>"
    assert bundle.special_tokens.eos_token_id == shakespeare_tok.special_token_ids["<|endoftext|>"]


def test_missing_directory_and_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="neither tokenizer.json"):
        load_pretrained_tokenizer(tmp_path)
