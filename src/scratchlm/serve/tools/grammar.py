"""The grammar of one forced tool call (tool_choice "required" or named), for the constrained decoder."""

from __future__ import annotations

import json

from scratchlm.generate.constrained.schema import Grammar, SchemaError, tagged_values
from scratchlm.serve.protocol import APIError
from scratchlm.serve.tools.plan import HERMES, LLAMA3, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolPlan


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
