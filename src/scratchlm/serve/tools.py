"""Tool calling: OpenAI `tools` / `tool_choice` in, the model family's own tool-call text out, parsed back
into OpenAI `tool_calls`.

Formats (chosen from the chat template's text):
    hermes       (Qwen2/2.5/3, Hermes, and scratchlm's ChatML):  <tool_call>\\n{"name": F, "arguments": {...}}\\n</tool_call>
                 one block per call; text before the first block is the message content
    llama3_json  (Llama 3.1+):  [<|python_tag|>]{"name": F, "parameters": {...}} (several joined by ";")
                 the whole reply is the call(s), or it is content
The tools reach the prompt through the template (`tools=` as transformers passes them). A model without a
template of its own (scratchlm's ChatML) gets them as a system message in the hermes format
(`chatml_tool_messages`); a template that never mentions tools is refused (the model would not see them).

tool_choice: "none" (tools shown, replies are plain content), "auto" (parse whatever the model writes),
"required" or {"type": "function", "function": {"name": F}}: the constrained decoder forces exactly one
call, to one of the tools (or to F), with arguments valid under that tool's parameters schema (the JSON
Schema subset of generate/constrained/schema.py).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from scratchlm.generate.constrained.schema import Grammar, SchemaError, tagged_values
from scratchlm.serve.protocol import APIError

HERMES, LLAMA3 = "hermes", "llama3_json"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
HERMES_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class ToolPlan:
    """What one request does with tools: their definitions, the choice, the output format."""

    tools: list[dict[str, Any]]  # OpenAI tool objects: {"type": "function", "function": {...}}
    choice: str  # none | auto | required | named
    forced: tuple[str, ...]  # the names a required / named choice may call
    format: str

    @property
    def parse(self) -> bool:
        return self.choice != "none"

    @property
    def constrained(self) -> bool:
        return self.choice in ("required", "named")


def tool_format(template_source: str | None) -> str:
    """The tool-call format a chat template teaches its model (400 when it does not render tools)."""
    if template_source is None or TOOL_CALL_OPEN in template_source:
        return HERMES
    if PYTHON_TAG in template_source or "ipython" in template_source:
        return LLAMA3
    if "tools" in template_source:
        return HERMES
    raise APIError(400, "this model's chat template does not render tools, so the model would never see them; "
                   "remove tools (or serve a model whose template supports tool calling)", param="tools")


def plan_tools(tools: list[dict] | None, tool_choice: Any, template_source: str | None) -> ToolPlan | None:
    """Validate tools / tool_choice against each other (400s name the problem)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools; send the tools the model may call", param="tool_choice")
        return None
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, f"tool names must be unique, got {names}", param="tools")
    choice, forced = tool_choice or "auto", tuple(names)
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        if name not in names:
            raise APIError(400, f"tool_choice names the function {name!r}, which is not in tools ({names})",
                           param="tool_choice")
        choice, forced = "named", (name,)
    return ToolPlan(tools, choice, forced, tool_format(template_source))


def call_grammar(plan: ToolPlan) -> Grammar:
    """The grammar of exactly one call to one of plan.forced, in the plan's format."""
    key = "parameters" if plan.format == LLAMA3 else "arguments"
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in plan.tools}
    options = [(('{"name": ' + json.dumps(n, ensure_ascii=False) + f', "{key}": ').encode(), schemas[n], b"}")
               for n in plan.forced]
    wrap = (f"{TOOL_CALL_OPEN}\n".encode(), f"\n{TOOL_CALL_CLOSE}".encode()) if plan.format == HERMES else (b"", b"")
    try:
        return tagged_values(options, *wrap)
    except SchemaError as exc:
        raise APIError(400, f"tools: a parameters schema is outside the supported subset for a forced tool call: "
                       f"{exc}", param="tools", code="unsupported_schema") from None


def _call(name: Any, args: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str, fmt: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a reply; no calls found -> (text, [])."""
    if fmt == HERMES:
        found = HERMES_CALL.findall(text)
        calls = []
        for body in found:
            try:
                obj = json.loads(body.strip())
            except ValueError:
                return text, []
            call = _call(obj.get("name"), obj.get("arguments", {})) if isinstance(obj, dict) else None
            if call is None:
                return text, []
            calls.append(call)
        if not calls:
            return text, []
        content = text[: text.index(TOOL_CALL_OPEN)]
        return (content if content.strip() else None), calls
    body = text.strip().removeprefix(PYTHON_TAG)
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        at = len(body) - len(body[at:].lstrip())
        if at == len(body):
            break
        try:
            obj, at = decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        args = obj.get("parameters", obj.get("arguments", {})) if isinstance(obj, dict) else None
        call = _call(obj.get("name"), args) if isinstance(obj, dict) else None
        if call is None:
            return text, []
        calls.append(call)
        rest = body[at:].lstrip()
        if rest.startswith(";"):
            at = len(body) - len(rest) + 1
    return (None, calls) if calls else (text, [])


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates expect them (transformers' convention): tool call arguments as
    dicts, a tool result named after the call it answers."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        content = None if m.content is None else m.text()  # a tool-call-only message keeps content None
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function",
                                "function": {"name": c.function.name, "arguments": c.function.parsed_arguments()}}
                               for c in m.tool_calls]
            names.update({c.id: c.function.name for c in m.tool_calls})
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
            name = m.name or names.get(m.tool_call_id or "")
            if name:
                d["name"] = name
        elif m.name:
            d["name"] = m.name
        out.append(d)
    return out


def chatml_tool_messages(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict[str, str]]:
    """scratchlm's ChatML has no tool syntax of its own: tools go into a system message (hermes format),
    assistant calls become <tool_call> blocks and tool results <tool_response> blocks."""
    out = []
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        intro = (f"You may call functions. The available tools:\n<tools>\n{listing}\n</tools>\nTo call one, answer "
                 f'with {TOOL_CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-object>}}\n{TOOL_CALL_CLOSE}')
        if messages and messages[0]["role"] == "system":
            messages = [{**messages[0], "content": messages[0]["content"] + "\n\n" + intro}, *messages[1:]]
        else:
            out.append({"role": "system", "content": intro})
    for m in messages:
        content = m.get("content") or ""
        for c in m.get("tool_calls") or []:
            call = {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            content += f"\n{TOOL_CALL_OPEN}\n{json.dumps(call, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"
        if m["role"] == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": m["role"], "content": content.strip("\n") if m.get("tool_calls") else content})
    return out


def held_back(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker` (it may still become it)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ToolStream:
    """One streamed choice under a tool plan: text is shown as content while it cannot be part of a tool call;
    from the first sign of a call (hermes: "<tool_call>"; llama3_json: a reply opening with "{" or the python
    tag; a forced call: from the start) it is held, and parsed when the choice ends."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text, self.shown = "", 0
        self.held = plan.constrained

    def push(self, delta: str) -> str:
        """The content that can be shown now."""
        self.text += delta
        if self.held:
            return ""
        if self.plan.format == HERMES:
            cut = self.text.find(TOOL_CALL_OPEN)
            if cut >= 0:
                self.held = True
                safe = cut
            else:
                safe = len(self.text) - held_back(self.text, TOOL_CALL_OPEN)
        else:
            start = self.text.lstrip()
            if start.startswith("{") or start.startswith(PYTHON_TAG):
                self.held = True
                return ""
            if not start or PYTHON_TAG.startswith(start):
                return ""  # undecided: whitespace, or the beginning of the python tag
            safe = len(self.text)
        out = self.text[self.shown:max(safe, self.shown)]
        self.shown = max(safe, self.shown)
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content still to show, tool calls) once the choice has ended."""
        content, calls = parse_tool_calls(self.text, self.plan.format)
        if not calls:
            rest, self.shown = self.text[self.shown:], len(self.text)
            return rest, []
        return "", calls
