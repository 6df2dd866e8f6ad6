"""What the request handlers share: model, tokenizer, scheduler, limits, and the request-level checks
(API key, model name, JSON body) that every endpoint applies."""

from __future__ import annotations

import asyncio
import hmac
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import Request

from scratchlm.tokenizer.chat.render import default_stop_ids
from scratchlm.model import TransformerLM
from scratchlm.serve.prometheus import ServerMetrics
from scratchlm.generate.speculative import SPEC_METHODS, Speculation
from scratchlm.serve.kv_space import BLOCK, DEFAULT_KV_CACHE_MB, blocks_for_bytes
from scratchlm.serve.prompting import JobContext
from scratchlm.serve.protocol import APIError
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.structured import StructuredOutput

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB
JSON_TYPES = ("application/json",)


@dataclass
class ServeOptions:
    """Server settings (the `scratchlm serve` flags); defaults are safe for a loopback server."""

    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_batch: int = 32
    decode: str = "model"
    prefill: str = "model"  # generate's prefill mode (generate/prefill.py): "model" or "bf16"
    max_queue: int = 256
    prefix_cache_mb: float = 256.0
    allowed_hosts: list[str] | None = None  # None: any Host header
    allowed_origins: list[str] | None = None  # None: no CORS headers at all
    max_context: int | None = None  # None: the model's max_seq_len (or less when the K/V pool holds less)
    kv_cache_mb: float = DEFAULT_KV_CACHE_MB  # the K/V block pool, shared by every sequence
    kv_cache_tokens: int | None = None  # the pool as a token budget instead (wins over kv_cache_mb)
    prefill_chunk: int = 512  # prompt tokens prefilled per scheduler step at most (chunked prefill)
    speculative: str | None = None  # "ngram" (prompt lookup) or "draft" (draft_model): speculative decoding
    draft_tokens: int = 4  # tokens drafted per row and step
    draft_model: Any = None  # the draft TransformerLM (same tokenizer), for speculative="draft"

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes={self.max_body_bytes} is too small; use at least 1024")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"--prefix-cache-mb {self.prefix_cache_mb} must be >= 0 (0 turns the cache off)")
        if self.kv_cache_mb <= 0:
            raise ValueError(f"--kv-cache-mb {self.kv_cache_mb} must be > 0")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 2:
            raise ValueError(f"--kv-cache-tokens {self.kv_cache_tokens} must be >= 2")
        if self.prefill_chunk < 1:
            raise ValueError(f"--prefill-chunk {self.prefill_chunk} must be >= 1 token")
        if self.speculative not in (None, *SPEC_METHODS):
            raise ValueError(f"--speculative {self.speculative!r} must be one of {SPEC_METHODS}")
        if (self.speculative == "draft") != (self.draft_model is not None):
            raise ValueError("--speculative draft needs --draft-model PATH (and --draft-model needs --speculative draft)")

    def speculation(self, vocab_size: int) -> Speculation | None:
        """The Speculation these options ask for (a draft model must share the model's vocabulary)."""
        if self.speculative is None:
            return None
        if self.draft_model is not None and self.draft_model.config.vocab_size != vocab_size:
            raise ValueError(f"the draft model's vocabulary ({self.draft_model.config.vocab_size} tokens) is not the "
                             f"model's ({vocab_size}); speculative decoding needs a draft sharing the tokenizer")
        return Speculation(self.speculative, k=self.draft_tokens, draft_model=self.draft_model)


def served_context(model_context: int, max_context: int | None) -> int:
    """The context the server offers: the model's, or --max-context when that is smaller."""
    if max_context is None:
        return model_context
    if not 2 <= max_context <= model_context:
        raise ValueError(f"--max-context {max_context} must be between 2 and the model's context ({model_context}); "
                         f"leave it out to serve the whole context")
    return max_context


def pool_blocks(model: TransformerLM, options: ServeOptions, context: int) -> int:
    """Blocks of the K/V pool: --kv-cache-tokens, else --kv-cache-mb, never more than every row could use
    (--max-batch x the context)."""
    wanted = (-(-options.kv_cache_tokens // BLOCK) if options.kv_cache_tokens is not None
              else blocks_for_bytes(model, options.kv_cache_mb))
    if wanted < 1:
        raise ValueError(f"--kv-cache-mb {options.kv_cache_mb} holds no {BLOCK}-token block of this model's K/V; "
                         "raise it")
    return min(wanted, options.max_batch * -(-context // BLOCK))


class ServerState:
    """One served model and everything the handlers need around it."""

    def __init__(self, model: TransformerLM, tokenizer: Any, model_name: str, options: ServeOptions,
                 stop_token_ids: list[int] | None = None, chat_template: Any = None) -> None:
        self.model, self.tokenizer, self.model_name, self.options = model, tokenizer, model_name, options
        self.api_key, self.max_body_bytes = options.api_key, options.max_body_bytes
        context = served_context(model.config.max_seq_len, options.max_context)
        blocks = pool_blocks(model, options, context)
        self.context = min(context, blocks * BLOCK)  # a sequence never holds more than the whole pool
        self.vocab_size = model.config.vocab_size
        self.scheduler = Scheduler(model, max_batch=options.max_batch, decode=options.decode,
                                   max_queue=options.max_queue, context=self.context, prefill=options.prefill,
                                   kv_blocks=blocks, prefix_blocks=blocks_for_bytes(model, options.prefix_cache_mb),
                                   prefill_chunk=options.prefill_chunk,
                                   speculation=options.speculation(model.config.vocab_size))
        chat_stops = list(dict.fromkeys([*(stop_token_ids or []), *default_stop_ids(tokenizer)]))
        structured = StructuredOutput(tokenizer, self.vocab_size, chat_stops)
        self.jobs = JobContext(tokenizer, self.context, self.vocab_size, structured, stop_token_ids, chat_stops,
                               chat_template)
        self.metrics = ServerMetrics(self.scheduler)
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="scratchlm-tokenize")
        self.draining = False

    def kv_summary(self) -> str:
        """The start-up line about K/V memory."""
        space = self.scheduler.space
        return (f"K/V pool {space.pool.capacity} blocks x {space.block} tokens = {space.bytes / (1 << 20):,.0f} MiB "
                f"(--kv-cache-mb / --kv-cache-tokens; filled as used), shared by up to {self.options.max_batch} "
                f"sequences of at most {self.context} tokens")

    def check_auth(self, request: Request) -> None:
        """401 unless `Authorization: Bearer <api key>` matches (when a key is configured)."""
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        if not header:
            raise APIError(401, "missing API key: send the header 'Authorization: Bearer YOUR_KEY'",
                           code="invalid_api_key")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    def check_open(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down; retry against another instance", "server_error",
                           code="server_shutting_down")

    async def read_json(self, request: Request) -> Any:
        """The body as JSON: Content-Type application/json (415 otherwise), at most max_body_bytes (413),
        valid JSON (400, never a 500 for numbers Python refuses to convert)."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in JSON_TYPES:
            raise APIError(415, f"Content-Type must be application/json, got {media or 'none'!r}; send the body as "
                           "JSON with that header", code="unsupported_media_type")
        limit = self.max_body_bytes
        too_big = APIError(413, f"request body exceeds the limit of {limit} bytes; send a smaller request",
                           code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
        try:
            return json.loads(body)
        except json.JSONDecodeError as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column "
                           f"{exc.colno}); send a JSON object") from None
        except UnicodeDecodeError:
            raise APIError(400, "the request body is not valid JSON (it is not UTF-8 text); send a JSON object") from None
        except RecursionError:
            raise APIError(400, "the request body is JSON nested too deeply to parse; send a flat JSON object") from None
        except ValueError:  # e.g. an integer of more than 4300 digits
            raise APIError(400, "the request body is not valid JSON: a number in it has too many digits; "
                           "send numbers of at most 4300 digits") from None

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the tokenizer threads (tokenizing must not stall other streams)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
