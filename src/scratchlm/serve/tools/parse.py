"""A reply's text -> (content, OpenAI tool_calls), in the plan's format (hermes blocks or llama3 JSON)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from scratchlm.serve.tools.plan import HERMES, PYTHON_TAG, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

HERMES_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


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
