"""A streamed choice under a tool plan: content is shown only while it cannot be part of a tool call."""

from __future__ import annotations

from typing import Any

from scratchlm.serve.tools.parse import parse_tool_calls
from scratchlm.serve.tools.plan import HERMES, PYTHON_TAG, TOOL_CALL_OPEN, ToolPlan


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
