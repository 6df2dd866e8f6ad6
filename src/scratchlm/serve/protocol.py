"""The OpenAI wire format: request models (validated with pydantic), response/chunk builders, errors.

Requests are validated strictly (no "5" -> 5 coercion) and every failure becomes an `APIError`,
rendered as OpenAI's error JSON:  {"error": {"message", "type", "param", "code"}}  with a 4xx status.
Sampling fields follow OpenAI's ranges: temperature [0, 2] (0 = greedy), top_p (0, 1],
presence/frequency penalty [-2, 2], n >= 1, max_tokens >= 1, stop: a string or up to 4 strings.
`top_k` and `min_p` are extensions (0 = off) used by the chat page.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_N = 16
MAX_STOP = 4


class APIError(Exception):
    """An error the client caused (or could act on): HTTP status + OpenAI error fields."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logprobs: bool | int | None = None
    logit_bias: dict[str, float] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple of non-empty strings (at most MAX_STOP)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise APIError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} non-empty "
                           f"strings, got {self.stop!r}", param="stop")
        return tuple(stops)

    def check_supported(self) -> None:
        """Reject OpenAI features this server does not implement (instead of silently ignoring them)."""
        if self.logprobs:
            raise APIError(400, "logprobs are not supported by scratchlm serve; remove the logprobs field",
                           param="logprobs")
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported by scratchlm serve; remove it", param="logit_bias")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo or self.suffix or (self.best_of is not None and self.best_of != self.n):
            raise APIError(400, "echo, suffix and best_of are not supported by scratchlm serve; remove them")


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise APIError(400, "tools / function calling are not supported by scratchlm serve", param="tools")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def parse_request(cls: type[SamplingFields], data: Any) -> Any:
    """Validate decoded JSON into `cls`; the first problem becomes a 400 naming the field."""
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        req = cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        got = repr(err.get("input"))[:80]
        raise APIError(400, f"invalid value for '{where}': {err['msg']} (got {got})", param=where) from None
    req.check_supported()
    return req


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseShape:
    """Builds the response and chunk JSON of one request (completions or chat share the rest)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def response(self, texts: list[str], reasons: list[str], use: dict[str, int]) -> dict[str, Any]:
        """The non-streamed body: one choice per text."""
        if self.chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r,
                        "logprobs": None} for i, (t, r) in enumerate(zip(texts, reasons))]
            return self._envelope("chat.completion", choices, usage=use)
        choices = [{"index": i, "text": t, "finish_reason": r, "logprobs": None}
                   for i, (t, r) in enumerate(zip(texts, reasons))]
        return self._envelope("text_completion", choices, usage=use)

    def chunk(self, index: int, text: str | None = None, finish_reason: str | None = None,
              role: bool = False) -> dict[str, Any]:
        """One streamed chunk for choice `index`: new text, the opening role (chat) or the finish reason."""
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        """The last chunk when stream_options.include_usage is set: no choices, the usage."""
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage=use)
