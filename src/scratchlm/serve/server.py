"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) and the chat page.

    GET  /                      the chat page (static/chat.html), talking to the API below
    GET  /v1/models[/{id}]      the one model served
    POST /v1/completions        text completion, `stream: true` -> server-sent events
    POST /v1/chat/completions   chat (ChatML template), same streaming
    POST /tokenize              token ids and count of a prompt or a conversation (vLLM's shape)
    GET  /health                liveness + scheduler counters (not part of OpenAI's API)
    GET  /metrics               Prometheus metrics (serve/prometheus.py)

Every request runs through the step-level batching Scheduler. Bad input of any kind answers 4xx with
OpenAI's error JSON and the server keeps serving; an internal failure answers 500 with a generic
message (the details go to the server log, never to the client). Streams are `data: {chunk}\\n\\n`
lines ending with `data: [DONE]`; a client that goes away mid-stream cancels its sequences, which frees
their rows. Layers, outermost first: Host allow-list + access log/metrics (guards.py), CORS (only with
allowed_origins), the routes (routes.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from scratchlm.model import TransformerLM
from scratchlm.serve.guards import GuardMiddleware
from scratchlm.serve.protocol import APIError
from scratchlm.serve.routes import add_routes
from scratchlm.serve.state import DEFAULT_MAX_BODY_BYTES, ServeOptions, ServerState

log = logging.getLogger("scratchlm.serve")
__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServeOptions", "create_app"]


def add_error_handlers(app: FastAPI) -> None:
    """Every error leaves as OpenAI's error JSON."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        err = APIError(exc.status_code, str(exc.detail), kind)
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error answering %s %s", request.method, request.url.path)
        err = APIError(500, "internal server error; the details are in the server log", "server_error",
                       code="internal_error")
        return JSONResponse(err.body(), status_code=500)


def create_app(model: TransformerLM, tokenizer: Any, model_name: str = "scratchlm",
               options: ServeOptions | None = None, *, stop_token_ids: list[int] | None = None,
               chat_template: Any = None, **settings: Any) -> FastAPI:
    """The FastAPI app serving `model`; the scheduler thread runs for the app's lifetime.
    Settings are ServeOptions fields, given as `options` or as keywords (api_key=..., max_batch=...).
    stop_token_ids: the model's end-of-text / end-of-turn ids (`load_pretrained`'s); by default the
    tokenizer's <|endoftext|> (completions) and <|im_end|> (chat). chat_template: the model's own
    (tokenizer.jinja_template.ChatTemplate); None = scratchlm's ChatML."""
    options = options or ServeOptions(**settings)
    state = ServerState(model, tokenizer, model_name, options, stop_token_ids, chat_template)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.scheduler.start()
        try:
            yield
        finally:
            state.scheduler.stop()
            state.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="scratchlm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    add_error_handlers(app)
    add_routes(app, state)
    if options.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], max_age=600)
    app.add_middleware(GuardMiddleware, allowed_hosts=options.allowed_hosts, metrics=state.metrics)
    return app
