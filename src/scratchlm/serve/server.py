"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) and the chat page.

    GET  /                      the chat page (static/chat.html), talking to the API below
    GET  /v1/models[/{id}]      the one model served
    POST /v1/completions        text completion, `stream: true` -> server-sent events
    POST /v1/chat/completions   chat (ChatML template), same streaming
    GET  /health                liveness + scheduler counters (not part of OpenAI's API)

Every request runs through the step-level batching Scheduler. Bad input of any kind answers 4xx with
OpenAI's error JSON and the server keeps serving. Streams are `data: {chunk}\\n\\n` lines ending with
`data: [DONE]`; a client that goes away mid-stream cancels its sequences, which frees their rows.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from scratchlm.model import TransformerLM
from scratchlm.serve.prompting import JobSpec, chat_job, completion_job
from scratchlm.serve.protocol import APIError, ChatRequest, CompletionRequest, ResponseShape, parse_request, usage
from scratchlm.serve.runs import RequestRun
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.sequence import Event, Finished

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB


class ServerState:
    """What the handlers share: model, tokenizer, scheduler and the limits."""

    def __init__(self, model: TransformerLM, tokenizer: Any, model_name: str, api_key: str | None,
                 max_body_bytes: int, max_batch: int, decode: str = "model") -> None:
        self.model, self.tokenizer, self.model_name = model, tokenizer, model_name
        self.api_key, self.max_body_bytes = api_key, max_body_bytes
        self.context = model.config.max_seq_len
        self.vocab_size = model.config.vocab_size
        self.scheduler = Scheduler(model, max_batch=max_batch, decode=decode)

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

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    async def read_json(self, request: Request) -> Any:
        """The body as JSON, at most max_body_bytes (413 beyond, 400 if it is not JSON)."""
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
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc}); send a JSON object") from None
        except RecursionError:
            raise APIError(400, "the request body is JSON nested too deeply to parse; send a flat JSON object") from None


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def event_lines(shape: ResponseShape, event: Event) -> str:
    """The SSE text of one scheduler event: a text chunk, or [an error and] the finish chunk."""
    if not isinstance(event, Finished):
        return sse(shape.chunk(event.index, text=event.text))
    finish = sse(shape.chunk(event.index, finish_reason=event.finish_reason))
    if event.error is None:
        return finish
    return sse(APIError(500, f"generation failed: {event.error}", "server_error").body()) + finish


async def stream_events(
    run: RequestRun, shape: ResponseShape, prompt_tokens: int, include_usage: bool
) -> AsyncIterator[str]:
    """SSE body: the chat role chunk, text chunks, one finish chunk per choice, [usage], [DONE]."""
    try:
        if shape.chat:
            for s in run.sequences:
                yield sse(shape.chunk(s.index, role=True))
        async for batch in run.events():
            yield "".join(event_lines(shape, event) for event in batch)
        if include_usage:
            yield sse(shape.usage_chunk(usage(prompt_tokens, run.completion_tokens)))
        yield sse("[DONE]")
    finally:
        run.close()


async def _watch_disconnect(request: Request, run: RequestRun) -> None:
    """Cancel the run when the client closes the connection (non-streamed requests)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            run.close()
            return


async def respond(state: ServerState, request: Request, job: JobSpec, shape: ResponseShape,
                  stream: bool, include_usage: bool) -> Any:
    """Run the job through the scheduler and answer as one JSON body or as an SSE stream."""
    run = RequestRun(state.scheduler, job, state.tokenizer, state.vocab_size)
    run.start()
    if stream:
        return StreamingResponse(stream_events(run, shape, job.prompt_tokens, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    watcher = asyncio.create_task(_watch_disconnect(request, run))
    try:
        async for _ in run.events():
            pass
    finally:
        watcher.cancel()
        run.close()
    if run.error is not None:
        raise APIError(500, f"generation failed: {run.error}", "server_error")
    reasons = [r or "stop" for r in run.reasons]
    return JSONResponse(shape.response(run.texts, reasons, usage(job.prompt_tokens, run.completion_tokens)))


def add_error_handlers(app: FastAPI) -> None:
    """Every error leaves as OpenAI's error JSON."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        err = APIError(exc.status_code, str(exc.detail), kind)
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(err.body(), status_code=500)


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(resources.files("scratchlm.serve").joinpath("static/chat.html").read_text("utf-8"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": state.model_name, **asdict(state.scheduler.stats)}

    def model_card() -> dict[str, Any]:
        return {"id": state.model_name, "object": "model", "created": 0, "owned_by": "scratchlm",
                "context_length": state.context}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        state.check_auth(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id}")
    async def model(request: Request, model_id: str) -> dict[str, Any]:
        state.check_auth(request)
        state.check_model(model_id)
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        state.check_auth(request)
        req = parse_request(CompletionRequest, await state.read_json(request))
        state.check_model(req.model)
        job = completion_job(req, state.tokenizer, state.context, state.vocab_size)
        return await respond(state, request, job, ResponseShape(False, req.model), req.stream, req.include_usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        state.check_auth(request)
        req = parse_request(ChatRequest, await state.read_json(request))
        state.check_model(req.model)
        job = chat_job(req, state.tokenizer, state.context)
        return await respond(state, request, job, ResponseShape(True, req.model), req.stream, req.include_usage)


def create_app(model: TransformerLM, tokenizer: Any, model_name: str = "scratchlm", *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_batch: int = 32, decode: str = "model") -> FastAPI:
    """The FastAPI app serving `model`; the scheduler thread runs for the app's lifetime."""
    if max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes={max_body_bytes} is too small; use at least 1024")
    state = ServerState(model, tokenizer, model_name, api_key, max_body_bytes, max_batch, decode)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.scheduler.start()
        try:
            yield
        finally:
            state.scheduler.stop()

    app = FastAPI(title="scratchlm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    add_error_handlers(app)
    add_routes(app, state)
    return app
