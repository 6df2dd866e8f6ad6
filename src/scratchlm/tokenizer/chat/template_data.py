"""What a chat template sees, prepared as transformers prepares it (utils/chat_template_utils.py):

  * keys whose value is None are dropped from each message (OpenAI clients send "content": null);
  * messages, tools, documents and extra variables are rebuilt from plain JSON types (str, int, float,
    bool, None, dict, list, tuple; dataclasses and pydantic models as dicts); anything else becomes the
    inert placeholder "<TypeName>", so the sandbox never holds objects with dangerous methods;
  * a message's reasoning given as "thinking" / "reasoning" / "reasoning_content" is visible under
    "reasoning_content" and "thinking" both (templates read either).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types (see module docstring)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain(value.model_dump())
    return f"<{type(value).__name__}>"


def alias_reasoning(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def prepare_messages(messages: Any) -> list[dict]:
    """The conversation as the template sees it; ValueError for a message that is not a dict."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("a chat needs a non-empty list of messages ({'role': ..., 'content': ...} dicts)")
    for n, m in enumerate(messages):
        if not isinstance(m, Mapping) and not dataclasses.is_dataclass(m) and not hasattr(m, "model_dump"):
            raise ValueError(f"message #{n} must be a dict with 'role' and 'content', got {m!r}")
    chat = plain([m for m in messages])
    chat = [{k: v for k, v in m.items() if v is not None} for m in chat]
    return alias_reasoning(chat)


def prepare_tools(tools: Any) -> list[dict] | None:
    """Tools as JSON schemas (dicts); a Python function is refused (write its JSON schema instead)."""
    if tools is None:
        return None
    out = []
    for n, t in enumerate(tools):
        if not isinstance(t, Mapping):
            raise ValueError(f"tools[{n}] must be a JSON schema dict ({{'type': 'function', 'function': {{...}}}}), "
                             f"got {type(t).__name__}")
        out.append(t)
    return plain(out)


def prepare_documents(documents: Any) -> list[dict] | None:
    if documents is None:
        return None
    for n, d in enumerate(documents):
        if not isinstance(d, Mapping):
            raise ValueError(f"documents[{n}] must be a dict with 'title' and 'text' keys, got {type(d).__name__}")
    return plain(list(documents))
