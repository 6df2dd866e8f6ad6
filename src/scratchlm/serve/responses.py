"""The OpenAI wire format, responses side: bodies, stream chunks and logprobs JSON of one request.

Logprobs (see sequence.TokenLogprob) become, for chat,
    {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}
and for completions
    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}], "text_offset": [...]}
A token whose bytes are not valid UTF-8 on their own (part of a character) is shown as
"bytes:\\xe2\\x80" (vLLM's convention); `bytes` always holds the raw bytes.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from scratchlm.generate.detokenize import token_bytes
from scratchlm.serve.sequence import TokenLogprob

LOGPROB_FLOOR = -9999.0  # JSON has no -inf


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


@dataclass
class ChoiceResult:
    """Everything one finished choice says: text, why it ended, its logprobs, parsed tool calls."""

    text: str | None = ""  # None: a reply that is only tool calls
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None


class TokenText:
    """id -> (shown string, raw bytes), cached: logprobs name every token they mention."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token: int) -> tuple[str, bytes]:
        hit = self._cache.get(token)
        if hit is None:
            raw = token_bytes(self.tokenizer, token)
            try:
                shown = raw.decode("utf-8")
            except UnicodeDecodeError:
                shown = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token] = (shown, raw)
        return hit


def _lp(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


class ResponseShape:
    """Builds the response and chunk JSON of one request (completions or chat share the rest)."""

    def __init__(self, chat: bool, model: str, tokenizer: Any, logprobs: int | None = None) -> None:
        self.chat, self.model, self.logprobs = chat, model, logprobs
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.text_of = TokenText(tokenizer)

    def _envelope(self, obj: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def logprobs_json(self, entries: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
        """The `logprobs` object of a choice or chunk (None when the request did not ask for logprobs)."""
        if self.logprobs is None:
            return None
        if self.chat:
            content = []
            for e in entries:
                shown, raw = self.text_of(e.token)
                top = [{"token": self.text_of(t)[0], "logprob": _lp(lp), "bytes": list(self.text_of(t)[1])}
                       for t, lp in e.top]
                content.append({"token": shown, "logprob": _lp(e.logprob), "bytes": list(raw), "top_logprobs": top})
            return {"content": content, "refusal": None}
        return {
            "tokens": [self.text_of(e.token)[0] for e in entries],
            "token_logprobs": [None if e.logprob is None else _lp(e.logprob) for e in entries],
            "top_logprobs": [None if e.logprob is None else {self.text_of(t)[0]: _lp(lp) for t, lp in e.top}
                             for e in entries],
            "text_offset": [e.offset for e in entries],
        }

    def response(self, choices: list[ChoiceResult], use: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed body: one choice per result."""
        out = []
        for i, c in enumerate(choices):
            lp = self.logprobs_json(c.logprobs)
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": c.text}
                if c.tool_calls:
                    message["tool_calls"] = c.tool_calls
                out.append({"index": i, "message": message, "finish_reason": c.finish_reason, "logprobs": lp})
            else:
                out.append({"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": lp})
        return self._envelope("chat.completion" if self.chat else "text_completion", out, usage=use)

    def chunk(self, index: int, text: str | None = None, finish_reason: str | None = None, role: bool = False,
              logprobs: tuple[TokenLogprob, ...] = (), tool_calls: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
        """One streamed chunk for choice `index`: new text, the opening role (chat) or the finish reason."""
        lp = self.logprobs_json(logprobs) if (logprobs or text) else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": lp}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": lp}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, use: dict[str, Any]) -> dict[str, Any]:
        """The last chunk when stream_options.include_usage is set: no choices, the usage."""
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage=use)
