"""Post-training data uses the model's own chat template when its checkpoint has one: SFT ids and the
assistant mask, prompts with the generation prompt, and the reply's end token, against jinja2 itself."""

from __future__ import annotations

import json

import jinja2
import torch

from scratchlm.align.toy_task import byte_tokenizer, toy_model_config
from scratchlm.model_files import save_model
from scratchlm.data.align_data import encode_chat, encode_completion, encode_prompt
from scratchlm.data.chat_format import ChatFormat, chat_format_of
from scratchlm.load import load_pretrained
from scratchlm.model import TransformerLM

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CHAT = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]


def test_sft_and_prompts_follow_the_models_template(tmp_path):
    save_model(TransformerLM(toy_model_config(259, d_model=32, n_layers=1)), tmp_path)
    tok = byte_tokenizer()
    tok.save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE,
                                                                "eos_token": "<|endoftext|>"}))
    loaded = load_pretrained(tmp_path)
    fmt = chat_format_of(loaded)
    eot = tok.special_token_ids["<|endoftext|>"]
    assert fmt.template is not None and fmt.reply_end_id == eot

    render = jinja2.Environment().from_string(TEMPLATE)
    text = render.render(messages=CHAT, add_generation_prompt=False, eos_token="<|endoftext|>")
    ids, mask = encode_chat(loaded.tokenizer, [CHAT], fmt)[0]
    assert ids == loaded.tokenizer.encode(text)
    trained = [t for t, m in zip(ids, mask) if m]
    assert loaded.tokenizer.decode(trained) == "4<|endoftext|>6<|endoftext|>"  # replies + their end token

    prompt = CHAT[:1]
    want = render.render(messages=prompt, add_generation_prompt=True, eos_token="<|endoftext|>")
    assert encode_prompt(loaded.tokenizer, prompt, fmt) == loaded.tokenizer.encode(want)
    assert encode_completion(loaded.tokenizer, prompt, "4", fmt)[-1] == eot
    # a model without a template keeps scratchlm's ChatML
    chatml = ChatFormat()
    assert encode_prompt(tok, prompt, chatml)[-3:] == tok.encode("assistant\n")[-3:]
    assert torch.equal(torch.tensor(encode_prompt(tok, "1+1=", fmt)), torch.tensor(tok.encode("1+1=")))
