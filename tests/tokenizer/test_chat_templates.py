"""Models' own chat templates (Llama-3.1/3.2, Qwen2.5 with tools, SmolLM2's ChatML, Gemma, Mistral, and a
template using every environment feature) rendered by scratchlm == transformers' apply_chat_template:
text, ids, errors, and the assistant mask ({% generation %} templates against HF's assistant_masks;
the prefix-difference method against hand-written expected replies)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.chat.template import ChatTemplate

from . import hf_styles

TEMPLATES = Path(__file__).parent / "chat_templates"
# template -> (tokenizer style, named special tokens, end-of-turn text the template writes after a reply)
FAMILIES = {
    "llama3_1": ("llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>"),
    "llama3_2": ("llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>"),
    "llama3_training": ("llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>"),
    "qwen2_5": ("qwen2_flags", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "<|im_end|>"),
    "qwen2_5_training": ("qwen2_flags", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "<|im_end|>"),
    "smollm2": ("qwen2_flags", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, "<|im_end|>"),
    "features": ("qwen2_flags", {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}, "<|im_end|>"),
    "gemma": ("gemma", {"bos_token": "<s>", "eos_token": "</s>"}, "<end_of_turn>"),
    "mistral": ("mistral", {"bos_token": "<s>", "eos_token": "</s>"}, "</s>"),
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. Köln"},
                                                           "unit": {"type": "string", "enum": ["C", "F"]}},
                          "required": ["city"]}}}
CHATS = {
    "one": [{"role": "user", "content": "Hi there! 👋"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}],
    "turns": [{"role": "user", "content": "  Grüße, 日本語で答えて <b>bold</b> & 'quotes'\n"},
              {"role": "assistant", "content": " こんにちは！\n\nSecond paragraph. "},
              {"role": "user", "content": "tabs\tand\nnewlines"}, {"role": "assistant", "content": "ok ✅"}],
    "tools": [{"role": "user", "content": "Weather in Köln?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Köln", "unit": "C"}}}]},
              {"role": "tool", "content": "{\"temp\": 21}"},
              {"role": "assistant", "content": "21 °C in Köln."}],
}
VALID = {"gemma": ["one", "turns"], "mistral": ["one", "turns"], "llama3_training": ["one", "system", "turns"],
         "smollm2": ["one", "system", "turns"]}  # the others take every chat


@pytest.fixture(scope="module")
def tokenizers(shared_data, tmp_path_factory):
    tmp, cache = tmp_path_factory.mktemp("chat"), {}

    def get(style):
        if style not in cache:
            hf = hf_styles.build(style, shared_data, tmp)
            cache[style] = hf, Tokenizer.from_hf_dict(json.loads(hf.to_str()))
        return cache[style]

    return get


def _pair(tokenizers, name: str, source: str | dict | None = None):
    style, specials, _ = FAMILIES[name]
    hf, ours = tokenizers(style)
    source = source if source is not None else (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    fast = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(hf), chat_template=source, **specials)
    return fast, ours, ChatTemplate(source, specials)


def _cases():
    for name in FAMILIES:
        for chat in VALID.get(name, list(CHATS)):
            yield name, chat


@pytest.mark.parametrize("name,chat", list(_cases()))
def test_render_and_ids_equal_transformers(tokenizers, name, chat):
    fast, ours, tmpl = _pair(tokenizers, name)
    messages = CHATS[chat]
    tools = [WEATHER] if chat == "tools" else None
    for gen in (False, True):
        want = fast.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False)
        assert tmpl.render(messages, add_generation_prompt=gen, tools=tools) == want
        ids = fast.apply_chat_template(messages, tools=tools, add_generation_prompt=gen)["input_ids"]
        assert tmpl.encode(ours, messages, gen, tools=tools)[0] == ids


@pytest.mark.parametrize("name", ["llama3_training", "qwen2_5_training", "features"])
def test_generation_block_mask_equals_transformers(tokenizers, name):
    fast, ours, tmpl = _pair(tokenizers, name)
    for chat in VALID.get(name, list(CHATS)):
        tools = [WEATHER] if chat == "tools" else None
        want = fast.apply_chat_template(CHATS[chat], tools=tools, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = tmpl.encode(ours, CHATS[chat], tools=tools)
        assert (ids, mask) == (want["input_ids"], want["assistant_masks"]), chat
        assert (sum(mask) > 0) == any(m["role"] == "assistant" for m in CHATS[chat])


def _masked_runs(tok, ids, mask) -> list[str]:
    """Text of each run of masked tokens, as it sits mid-sequence (a decoder strips a leading space only
    at the very start of a text)."""
    runs, cur = [], []
    for i, m in list(zip(ids, mask)) + [(None, 0)]:
        if m:
            cur.append(i)
        elif cur:
            runs.append(b"".join(tok.vocab[j] for j in cur).decode("utf-8"))
            cur = []
    return runs


@pytest.mark.parametrize("name", ["qwen2_5", "smollm2", "llama3_1", "gemma", "mistral"])
def test_prefix_difference_mask_covers_exactly_each_reply(tokenizers, name):
    """Without {% generation %}: the masked tokens are each reply's content and the turn's end token."""
    _, ours, tmpl = _pair(tokenizers, name)
    end = FAMILIES[name][2]
    chat = CHATS["turns"]
    ids, mask = tmpl.encode(ours, chat)
    trim = name in ("llama3_1", "gemma")  # these templates strip message content
    expected = [(m["content"].strip() if trim else m["content"]) + end for m in chat if m["role"] == "assistant"]
    assert _masked_runs(ours, ids, mask) == expected


def test_template_errors_are_transformers_errors(tokenizers):
    fast, ours, tmpl = _pair(tokenizers, "gemma")
    bad = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    with pytest.raises(Exception, match="System role not supported"):
        fast.apply_chat_template(bad, tokenize=False)
    with pytest.raises(ValueError, match="chat template error: System role not supported"):
        tmpl.render(bad)
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ValueError, match="non-empty list of messages"):
        tmpl.render([])


def test_extra_variables_documents_and_reasoning_equal_transformers(tokenizers):
    fast, _, tmpl = _pair(tokenizers, "features")
    docs = [{"title": "A", "text": "first"}, {"title": "B", "text": "<second>"}, {"title": "C", "text": "cut"}]
    chat = [{"role": "user", "content": "hm"}, {"role": "assistant", "content": "yes", "reasoning": "because"},
            {"role": "user", "content": "ok"}]
    for kw in ({}, {"enable_thinking": False, "extra_footer": True}, {"date_string": "1 Jan 2026", "extra_footer": 1}):
        want = fast.apply_chat_template(chat, documents=docs, add_generation_prompt=True, tokenize=False, **kw)
        assert tmpl.render(chat, add_generation_prompt=True, documents=docs, **kw) == want
    with pytest.raises(ValueError, match="unknown role robot"):
        tmpl.render([{"role": "robot", "content": "beep"}])


def test_continue_final_message_equals_transformers(tokenizers):
    fast, _, tmpl = _pair(tokenizers, "qwen2_5")
    chat = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}]
    want = fast.apply_chat_template(chat, continue_final_message=True, tokenize=False)
    assert tmpl.render(chat, continue_final_message=True) == want and want.endswith("One, two,")


def test_named_templates_pick_tool_use_with_tools(tokenizers):
    both = {"default": (TEMPLATES / "smollm2.jinja").read_text(), "tool_use": (TEMPLATES / "qwen2_5.jinja").read_text()}
    fast, _, tmpl = _pair(tokenizers, "smollm2", both)
    chat = CHATS["one"]
    for tools in (None, [WEATHER]):
        assert tmpl.render(chat, tools=tools) == fast.apply_chat_template(chat, tools=tools, tokenize=False)
    assert "# Tools" in tmpl.render(chat, tools=[WEATHER]) and "# Tools" not in tmpl.render(chat)
    with pytest.raises(ValueError, match="does not exist"):
        tmpl.render(chat, template_name="rag")
