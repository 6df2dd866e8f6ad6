"""A request's tool plan: OpenAI `tools` / `tool_choice` validated against each other, and the tool-call
format the model's chat template teaches it (hermes or llama3_json; see serve/tools/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scratchlm.serve.protocol import APIError

HERMES, LLAMA3 = "hermes", "llama3_json"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


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
