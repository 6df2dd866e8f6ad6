"""OpenAI chat messages as chat templates expect them, and tools for scratchlm's ChatML (no tool syntax)."""

from __future__ import annotations

import json
from typing import Any

from scratchlm.serve.tools.plan import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


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
