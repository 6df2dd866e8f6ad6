"""Line-numbered JSONL reading for the post-training datasets: every error names FILE:LINE and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")
CHAT_ROLES = ("system", "user", "assistant", "tool")  # OpenAI's chat roles; anything else is a typo


def read_jsonl(path: str | Path, parse: Callable[[dict[str, Any]], T], what: str) -> list[T]:
    """parse(record) for every non-blank line; a bad line raises ValueError("PATH line N: ...").

    `parse` raises ValueError with the reason; `what` names the format in the messages (e.g. "chat").
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} data file {path} is a directory; give a .jsonl file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} data file {path} does not exist")
    out: list[T] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path} line {n}: not valid UTF-8 (byte {exc.start} of the line is "
                                 f"{raw[exc.start:exc.start + 1]!r}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} line {n}: not valid JSON ({exc.msg}); each line must be one JSON object")
            if not isinstance(record, dict):
                raise ValueError(f"{path} line {n}: expected a JSON object, got {type(record).__name__}")
            try:
                out.append(parse(record))
            except ValueError as exc:
                raise ValueError(f"{path} line {n}: {exc}") from None
    if not out:
        raise ValueError(f"{path} has no {what} records; it must hold one JSON object per line")
    return out


def require_str(record: dict[str, Any], key: str, allow_empty: bool = False) -> str:
    """record[key] as a str, or a ValueError naming the key."""
    value = record.get(key)
    if not isinstance(value, str) or (not allow_empty and not value):
        raise ValueError(f"field {key!r} must be a non-empty string, got {value!r}")
    return value


def check_messages(messages: Any, key: str = "messages") -> list[dict[str, str]]:
    """A non-empty list of {"role": str, "content": str} dicts whose roles are in CHAT_ROLES."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"field {key!r} must be a non-empty list of {{'role', 'content'}} objects, got {messages!r}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{key}[{i}] must be an object with string 'role' and 'content', got {m!r}")
        if m["role"] not in CHAT_ROLES:
            raise ValueError(f"{key}[{i}] has role {m['role']!r}; valid roles: {', '.join(CHAT_ROLES)}")
    return messages
