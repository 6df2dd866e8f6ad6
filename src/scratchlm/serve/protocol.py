"""The OpenAI wire format, requests side: pydantic request models, strict validation, errors.

Requests are validated strictly (no "5" -> 5 coercion) and every failure becomes an `APIError`,
rendered as OpenAI's error JSON:  {"error": {"message", "type", "param", "code"}}  with a 4xx status.
Sampling fields follow OpenAI's ranges: temperature [0, 2] (0 = greedy), top_p (0, 1],
presence/frequency penalty [-2, 2], n >= 1, max_tokens >= 1, stop: a string or up to 4 strings.
`top_k`, `min_p` and `repetition_penalty` are extensions (as in vLLM).

Nothing is silently ignored: a field OpenAI defines but this server does not implement answers 400
naming it and why (UNSUPPORTED), and so does a field OpenAI does not define at all; only fields that
cannot change the output (`user`, `metadata`, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_N = 16
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20

# OpenAI request fields this server does not implement, and why (a 400 names them).
UNSUPPORTED = {
    "logit_bias": "logit_bias is not supported",
    "suffix": "suffix (insertion) is not supported",
    "audio": "audio output is not supported (text only)",
    "modalities": "only text output is supported; remove modalities",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "this model has no reasoning-effort control",
    "verbosity": "this model has no verbosity control",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated functions field is not supported; send tools instead",
    "function_call": "the deprecated function_call field is not supported; send tool_choice instead",
}


class APIError(Exception):
    """An error the client caused (or could act on): HTTP status + OpenAI error fields (+ headers)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class StreamOptions(Strict):
    include_usage: bool = False


class JSONSchemaFormat(Strict):
    name: str = Field(min_length=1, max_length=64)
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class SamplingFields(Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # accepted and ignored: they cannot change the output
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: Literal[False] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple of non-empty strings (at most MAX_STOP)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise APIError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} non-empty "
                           f"strings, got {self.stop!r}", param="stop")
        return tuple(stops)

    def check_supported(self) -> None:
        """Cross-field rules pydantic cannot express."""
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is None:
            raise APIError(400, "response_format type 'json_schema' needs a json_schema object "
                           "({'name': ..., 'schema': {...}})", param="response_format.json_schema")
        if fmt is not None and fmt.type != "text" and self.stop:
            raise APIError(400, "stop cannot be combined with a JSON response_format (a stop string could cut "
                           "the JSON); remove stop", param="stop")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def top_logprobs_n(self) -> int | None:
        """How many alternatives to report per token; None = no logprobs at all."""
        raise NotImplementedError


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, f"best_of={self.best_of} (ranking several samples) is not supported; use n",
                           param="best_of")
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens=0 is only meaningful with echo=true (scoring the prompt); "
                           "ask for at least 1 token", param="max_tokens")

    @property
    def top_logprobs_n(self) -> int | None:
        return self.logprobs


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def parsed_arguments(self) -> Any:
        try:
            return json.loads(self.arguments)
        except ValueError:
            raise APIError(400, f"tool call arguments of {self.name!r} are not valid JSON: {self.arguments[:80]!r}",
                           param="messages") from None


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # what the openai client echoes back from a response message; must be empty
    refusal: None = None
    annotations: list[Any] | None = Field(default=None, max_length=0)
    audio: None = None
    function_call: None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        for i, m in enumerate(self.messages):
            if m.role == "tool" and (m.tool_call_id is None or m.content is None):
                raise APIError(400, f"messages[{i}]: a tool message needs tool_call_id and content",
                               param=f"messages.{i}")
            if m.content is None and not (m.role == "assistant" and m.tool_calls):
                raise APIError(400, f"messages[{i}]: content is missing (only an assistant message with tool_calls "
                               "may leave it out)", param=f"messages.{i}.content")
            if m.tool_calls and m.role != "assistant":
                raise APIError(400, f"messages[{i}]: only assistant messages carry tool_calls", param=f"messages.{i}")
        self._check_tool_answers()
        if self.response_format is not None and self.response_format.type != "text" and \
                self.tool_choice not in (None, "none", "auto"):
            raise APIError(400, "a forced tool_choice cannot be combined with a JSON response_format; use one",
                           param="tool_choice")

    def _check_tool_answers(self) -> None:
        """As OpenAI: a tool message answers a call of the assistant message right before it (only other tool
        messages between), by that call's id; anything else is a 400."""
        open_calls: set[str] | None = None  # ids of the last assistant message's calls, while tool messages follow
        for i, m in enumerate(self.messages):
            if m.role == "assistant":
                open_calls = {c.id for c in m.tool_calls} if m.tool_calls else None
            elif m.role != "tool":
                open_calls = None
            elif open_calls is None:
                raise APIError(400, f"messages[{i}]: a message with role 'tool' must be a response to a preceding "
                               "assistant message with 'tool_calls'", param=f"messages.{i}")
            elif m.tool_call_id not in open_calls:
                raise APIError(400, f"messages[{i}]: tool_call_id {m.tool_call_id!r} answers none of the preceding "
                               f"assistant message's tool calls ({', '.join(sorted(open_calls))})",
                               param=f"messages.{i}.tool_call_id")

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return None if not self.tools else [t.model_dump(exclude_none=True) for t in self.tools]

    def tool_choice_value(self) -> Any:
        c = self.tool_choice
        return c.model_dump() if isinstance(c, NamedToolChoice) else c

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def top_logprobs_n(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def _check_fields(cls: type[SamplingFields], data: dict[str, Any]) -> None:
    """400 naming every top-level field the server does not implement or does not know."""
    known = set(cls.model_fields)
    unsupported = [k for k in data if k in UNSUPPORTED and k not in known]
    if unsupported:
        why = "; ".join(UNSUPPORTED[k] for k in unsupported)
        raise APIError(400, f"unsupported field(s) {', '.join(map(repr, unsupported))}: {why}", param=unsupported[0])
    unknown = [k for k in data if k not in known]
    if unknown:
        raise APIError(400, f"unrecognized request field(s) {', '.join(map(repr, unknown))}; remove them "
                       f"(this endpoint takes {', '.join(sorted(known))})", param=unknown[0])


def parse_request(cls: type[SamplingFields], data: Any) -> Any:
    """Validate decoded JSON into `cls`; the first problem becomes a 400 naming the field."""
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    _check_fields(cls, data)
    try:
        req = cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        got = repr(err.get("input"))[:80]
        raise APIError(400, f"invalid value for '{where}': {err['msg']} (got {got})", param=where) from None
    req.check_supported()
    return req
