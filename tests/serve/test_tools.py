"""Tool calling through the official openai client, for scratchlm's ChatML, for chat templates in the two
supported families' styles (tool_templates.py: Hermes/Qwen <tool_call> JSON, Llama-3 JSON) and for the models'
own Qwen2.5 and Llama-3.1 templates (tests/tokenizer/chat_templates, rendered there equal to transformers):

    - the prompt's ids (the server's /tokenize and usage) are transformers' `apply_chat_template` ids for the
      template's rendering of tools, assistant tool calls and tool results, on a transformers tokenizer built
      from the checkpoint's tokenizer files (hf_tokenizer.py), given the messages in transformers' convention
      written out by hand here (scratchlm's built-in ChatML, which has no Jinja source: its text by hand)
    - tool_choice "required" / a named function: every sampled choice is exactly one call to an allowed
      function whose arguments validate against its parameters (jsonschema), streamed and not
    - tool_choice "auto": a scripted model writes content and a call; the client gets the content and the
      parsed tool_calls (finish_reason "tool_calls"), streamed and not
    - parsers and the streaming filter on their own, and the 400s
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import openai
import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.serve.server import create_app
from scratchlm.serve.tools import HERMES, LLAMA3, ToolStream, ToolPlan, parse_tool_calls
from scratchlm.tokenizer.chat.template import ChatTemplate

from hf_tokenizer import hf_tokenizer
from inprocess import serve_in_thread
import tool_templates

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}, "utc": {"type": "boolean"}}}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
REAL = Path(__file__).parents[1] / "tokenizer" / "chat_templates"  # the models' own templates (tests/tokenizer)
QWEN2_5, LLAMA3_1 = (REAL / "qwen2_5.jinja").read_text(), (REAL / "llama3_1.jinja").read_text()
TEMPLATES = {"chatml": None, "hermes": tool_templates.HERMES, "llama3": tool_templates.LLAMA3,
             "qwen2_5": QWEN2_5, "llama3_1": LLAMA3_1}


class ScriptedModel(TransformerLM):
    """Puts all the mass on script[k] for the k-th generated token (from the position and prompt_len), then
    on `end`: a model that answers exactly what the test wants."""

    script: list[int] = []
    prompt_len = 0
    end = 0

    def forward(self, input_ids, token_positions=None, attention_mask=None, kv_cache=None, logits_to_keep=0):
        out = super().forward(input_ids, token_positions, attention_mask, kv_cache, logits_to_keep)
        pos = token_positions.expand(input_ids.shape[0], -1)[:, -out.shape[1]:]  # (B, n)
        k = pos - (self.prompt_len - 1)
        script = torch.tensor(self.script + [self.end])
        target = script[k.clamp(0, len(self.script))]  # (B, n)
        return torch.full_like(out, -30.0).scatter(-1, target[..., None], 30.0)


@pytest.fixture(scope="module")
def long_model(reference):
    """The tiny checkpoint's tokenizer with a random model of a 2048-token context (tool listings are long in a
    320-token vocabulary)."""
    _, tok = reference
    torch.manual_seed(7)
    config = get_preset("llama-tiny", vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        max_seq_len=2048, init_std=0.5)
    return TransformerLM(config).eval(), tok


@pytest.fixture(scope="module", params=list(TEMPLATES))
def tool_server(request, long_model):
    model, tok = long_model
    source = TEMPLATES[request.param]
    template = None if source is None else ChatTemplate(source)
    with serve_in_thread(create_app(model, tok, "m", chat_template=template)) as (url, _):
        yield request.param, url, template, tok


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def tokenize(url: str, messages: list, tools=None) -> list[int]:
    """The server's prompt ids for `messages` (its /tokenize route)."""
    import httpx

    r = httpx.post(url + "/tokenize", json={"messages": messages, **({"tools": tools} if tools else {})}, timeout=30)
    r.raise_for_status()
    body = r.json()
    assert body["count"] == len(body["tokens"])
    return body["tokens"]


def check_call(call, allowed: list[str]) -> None:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in allowed
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_prompt_renders_tools_calls_and_results(tool_server, tiny_checkpoint):
    kind, url, _, _ = tool_server
    convo = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    hf = ASK + [  # transformers' convention, by hand: arguments as a dict, the result named after its call
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}]
    reference = hf_tokenizer(tiny_checkpoint, TEMPLATES[kind])  # transformers, from the checkpoint's files
    if TEMPLATES[kind] is not None:
        expected = reference.apply_chat_template(hf, tools=TOOLS, add_generation_prompt=True)["input_ids"]
    else:  # scratchlm's built-in ChatML has no Jinja source: its rendering written out by hand
        listing = "\n".join(json.dumps(t) for t in TOOLS)
        text = ("<|im_start|>system\nYou may call functions. The available tools:\n<tools>\n" + listing + "\n</tools>\n"
                'To call one, answer with <tool_call>\n{"name": <function-name>, "arguments": <args-object>}\n'
                "</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
                "<|im_start|>tool\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        expected = reference(text, add_special_tokens=False)["input_ids"]
    assert tokenize(url, convo, TOOLS) == expected
    out = api(url).chat.completions.create(model="m", messages=convo, tools=TOOLS, max_tokens=2, temperature=0,
                                           tool_choice="none")
    assert out.usage.prompt_tokens == len(expected) and out.choices[0].message.tool_calls is None


def test_required_call_is_valid_for_every_sampled_choice(tool_server):
    _, url, _, _ = tool_server
    out = api(url).chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required", n=3,
                                           temperature=1.0, seed=2, max_tokens=120)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        check_call(choice.message.tool_calls[0], ["get_weather", "get_time"])


def test_named_function_streamed(tool_server):
    _, url, _, _ = tool_server
    stream = api(url).chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=1.0, seed=5, max_tokens=120, stream=True)
    calls, reasons, content = {}, [], ""
    for ch in stream:
        delta = ch.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            slot = calls.setdefault(c.index, {"id": c.id, "name": "", "arguments": ""})
            slot["name"] += c.function.name or ""
            slot["arguments"] += c.function.arguments or ""
        reasons += [ch.choices[0].finish_reason] if ch.choices[0].finish_reason else []
    assert content == "" and reasons == ["tool_calls"] and list(calls) == [0] and calls[0]["name"] == "get_time"
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME["function"]["parameters"])


@pytest.mark.parametrize("fmt,template", [(HERMES, tool_templates.HERMES), (HERMES, QWEN2_5),
                                          (LLAMA3, tool_templates.LLAMA3), (LLAMA3, LLAMA3_1)],
                         ids=["hermes", "qwen2_5", "llama3", "llama3_1"])
def test_auto_parses_a_scripted_reply(long_model, fmt, template):
    model, tok = long_model
    scripted = ScriptedModel(model.config).eval()
    scripted.load_state_dict(model.state_dict())
    if fmt == HERMES:
        reply = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
    else:
        reply = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}'
    scripted.script, scripted.end = tok.encode(reply), tok.special_token_ids["<|im_end|>"]
    with serve_in_thread(create_app(scripted, tok, "m", chat_template=ChatTemplate(template))) as (url, _):
        scripted.prompt_len = len(tokenize(url, ASK, TOOLS))
        c = api(url)
        whole = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=200, temperature=0)
        chunks = list(c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=200, temperature=0,
                                                stream=True))
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls", whole.choices[0].message.content
    assert msg.content == ("Let me check.\n" if fmt == HERMES else None)
    assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "C"})]
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    calls = [t for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
    assert streamed == (msg.content or "") and [t.function.arguments for t in calls] == [msg.tool_calls[0].function.arguments]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


HERMES_TEXT = ('Sure.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
               '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": [2]}"}\n</tool_call>')
LLAMA_TEXT = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [2]}}'


@pytest.mark.parametrize("fmt,text,content", [(HERMES, HERMES_TEXT, "Sure.\n"), (LLAMA3, LLAMA_TEXT, None)])
def test_parsers(fmt, text, content):
    got, calls = parse_tool_calls(text, fmt)
    assert got == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("a", {"x": 1}),
                                                                                               ("b", {"y": [2]})]
    assert len({c["id"] for c in calls}) == 2
    for broken in (text[:-5], text.replace('"x"', "x")):
        assert parse_tool_calls(broken, fmt) == (broken, [])  # not parseable: it stays content
    assert parse_tool_calls("just words {", fmt) == ("just words {", [])


@pytest.mark.parametrize("fmt,text", [(HERMES, HERMES_TEXT), (HERMES, "plain <tool reply> text"),
                                      (LLAMA3, LLAMA_TEXT), (LLAMA3, "  plain {text}"), (LLAMA3, "<|python_t")])
def test_tool_stream_shows_what_the_whole_reply_shows(fmt, text):
    rng = random.Random(0)
    content, calls = parse_tool_calls(text, fmt)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), 4))
        stream = ToolStream(ToolPlan(TOOLS, "auto", (), fmt))
        shown = "".join(stream.push(p) for p in (text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])))
        rest, got = stream.finish()
        assert shown + rest == (content or "") if calls else shown + rest == text
        assert [c["function"] for c in got] == [c["function"] for c in calls]


def test_tool_requests_that_cannot_work_are_400s(long_model):
    model, tok = long_model
    with serve_in_thread(create_app(model, tok, "m", chat_template=ChatTemplate(tool_templates.NO_TOOLS))) as (url, _):
        with pytest.raises(openai.BadRequestError, match="does not render tools"):
            api(url).chat.completions.create(model="m", messages=ASK, tools=TOOLS)
    with serve_in_thread(create_app(model, tok, "m")) as (url, _):
        c = api(url)
        bad = [dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
               dict(tool_choice="required"),
               dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
               dict(tools=[{"type": "function", "function": {"name": "has space"}}]),
               dict(tools=[WEATHER, WEATHER]),
               dict(tools=TOOLS, tool_choice="required", max_tokens=5)]
        for kw in bad:
            with pytest.raises(openai.BadRequestError):
                c.chat.completions.create(model="m", messages=ASK, **kw)
        with pytest.raises(openai.BadRequestError, match="tool_call_id"):
            c.chat.completions.create(model="m", messages=ASK + [{"role": "tool", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match="must be a response to a preceding"):
            c.chat.completions.create(model="m", messages=ASK + [{"role": "tool", "tool_call_id": "call_1", "content": "x"}])


CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}


def answer(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "18 C"}


@pytest.mark.parametrize("messages,error", [
    (ASK + [answer("call_1")], "must be a response to a preceding"),  # no assistant call at all
    (ASK + [CALL, answer("call_9")], "answers none of the preceding"),  # an id no call has
    (ASK + [CALL, answer("call_1"), {"role": "user", "content": "and?"}, answer("call_2")],
     "must be a response to a preceding"),  # a user turn closed the calls
    (ASK + [CALL, {"role": "assistant", "content": "done"}, answer("call_1")], "must be a response to a preceding"),
    (ASK + [CALL, answer("call_2"), answer("call_1")], None),  # any order, only tool messages between
    ([{"role": "system", "content": "s"}] + ASK + [CALL, answer("call_1"), answer("call_2"),
                                                  {"role": "assistant", "content": "18 C"}], None),
])
def test_tool_message_must_answer_an_earlier_call(messages, error):
    """OpenAI answers 400 to a tool message that answers no call of the assistant message right before it
    (only other tool messages may come between); a well-formed history parses."""
    from scratchlm.serve.protocol import APIError, ChatRequest, parse_request

    body = {"model": "m", "messages": messages}
    if error is None:
        assert len(parse_request(ChatRequest, body).messages) == len(messages)
        return
    with pytest.raises(APIError, match=error) as info:
        parse_request(ChatRequest, body)
    assert info.value.status == 400 and info.value.param.startswith("messages.")
