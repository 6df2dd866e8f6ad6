"""The HTTP endpoints and how one request's run is answered: one JSON body or a server-sent event stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import Field

from scratchlm.serve.prompting import JobSpec, chat_job, check_size, completion_job, render_messages
from scratchlm.serve.protocol import (APIError, ChatMessage, ChatRequest, CompletionRequest, Strict, Tool,
                                     parse_request)
from scratchlm.serve.responses import ResponseShape, usage
from scratchlm.serve.runs import RequestRun
from scratchlm.serve.sequence import Event, Finished
from scratchlm.serve.state import ServerState
from scratchlm.serve.tools import ToolPlan, ToolStream, parse_tool_calls


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def run_error(state: ServerState, message: str) -> APIError:
    if state.draining:
        return APIError(503, message, "server_error", code="server_shutting_down")
    return APIError(500, message, "server_error", code="internal_error")


class EventWriter:
    """The SSE text of scheduler events: text chunks, tool-call chunks, [an error and] the finish chunk.
    Under a tool plan each choice's text goes through a ToolStream (content shown only while it cannot be
    a tool call; the calls are sent whole when the choice ends)."""

    def __init__(self, state: ServerState, shape: ResponseShape, plan: ToolPlan | None, choices: int) -> None:
        self.state, self.shape = state, shape
        self.tools = [ToolStream(plan) for _ in range(choices)] if plan is not None and plan.parse else None

    def lines(self, event: Event) -> str:
        shape = self.shape
        if not isinstance(event, Finished):
            text = event.text if self.tools is None else self.tools[event.index].push(event.text)
            return sse(shape.chunk(event.index, text=text, logprobs=event.logprobs)) if text or event.logprobs else ""
        out, reason = "", event.finish_reason
        if self.tools is not None and event.error is None:
            rest, calls = self.tools[event.index].finish()
            if rest:
                out += sse(shape.chunk(event.index, text=rest))
            if calls:
                indexed = [{"index": i, **c} for i, c in enumerate(calls)]
                out += sse(shape.chunk(event.index, tool_calls=indexed))
                reason = "tool_calls"
        if event.error is not None:
            out += sse(run_error(self.state, event.error).body())
        return out + sse(shape.chunk(event.index, finish_reason=reason))


def apply_tool_calls(run: RequestRun, plan: ToolPlan | None) -> None:
    """Non-streamed replies: tool calls parsed out of each choice's text (finish_reason "tool_calls")."""
    if plan is None or not plan.parse:
        return
    for res in run.results:
        content, calls = parse_tool_calls(res.text, plan.format)
        if calls:
            res.text, res.tool_calls, res.finish_reason = content, calls, "tool_calls"


def record(request: Request, run: RequestRun, job: JobSpec) -> None:
    """What the access log and the metrics report for this request."""
    request.state.usage = {"prompt": job.prompt_tokens, "completion": run.completion_tokens,
                           "cached": run.cached_tokens, "ttft": run.ttft}


async def stream_events(state: ServerState, request: Request, run: RequestRun, job: JobSpec, shape: ResponseShape,
                        include_usage: bool) -> AsyncIterator[str]:
    """SSE body: the chat role chunk, text chunks, one finish chunk per choice, [usage], [DONE]."""
    writer = EventWriter(state, shape, job.tools, len(run.sequences))
    try:
        if shape.chat:
            for s in run.sequences:
                yield sse(shape.chunk(s.index, role=True))
        async for batch in run.events():
            yield "".join(writer.lines(event) for event in batch)
        if include_usage:
            yield sse(shape.usage_chunk(usage(job.prompt_tokens, run.completion_tokens, run.cached_tokens)))
        yield sse("[DONE]")
    finally:
        run.close()
        record(request, run, job)


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
        return StreamingResponse(stream_events(state, request, run, job, shape, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    watcher = asyncio.create_task(_watch_disconnect(request, run))
    try:
        async for _ in run.events():
            pass
    finally:
        watcher.cancel()
        run.close()
        record(request, run, job)
    if run.error is not None:
        raise run_error(state, run.error)
    apply_tool_calls(run, job.tools)
    return JSONResponse(shape.response(run.results, usage(job.prompt_tokens, run.completion_tokens, run.cached_tokens)))


class TokenizeRequest(Strict):
    """POST /tokenize (vLLM's shape): a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None


def add_api_routes(app: FastAPI, state: ServerState) -> None:
    """/v1/completions, /v1/chat/completions and /tokenize."""

    async def begin(request: Request, cls: type) -> Any:
        state.check_auth(request)
        state.check_open()
        req = parse_request(cls, await state.read_json(request))
        state.check_model(req.model)
        check_size(req, state.jobs)
        return req

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = await begin(request, CompletionRequest)
        job = await state.off_loop(completion_job, req, state.jobs)
        shape = ResponseShape(False, req.model, state.tokenizer, req.top_logprobs_n)
        return await respond(state, request, job, shape, req.stream, req.include_usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = await begin(request, ChatRequest)
        job = await state.off_loop(chat_job, req, state.jobs)
        shape = ResponseShape(True, req.model, state.tokenizer, req.top_logprobs_n)
        return await respond(state, request, job, shape, req.stream, req.include_usage)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        state.check_auth(request)
        data = await state.read_json(request)
        try:
            req = TokenizeRequest.model_validate(data)
        except Exception as exc:
            raise APIError(400, f"invalid /tokenize request: {str(exc).splitlines()[0]}; send "
                           "{'prompt': TEXT} or {'messages': [...]}") from None
        state.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of 'prompt' and 'messages'")
        if req.prompt is not None:
            ids = await state.off_loop(state.tokenizer.encode, req.prompt)
        else:
            tools = None if not req.tools else [t.model_dump(exclude_none=True) for t in req.tools]
            ids = await state.off_loop(render_messages, req.messages, state.jobs, req.add_generation_prompt, tools)
        return {"count": len(ids), "max_model_len": state.context, "tokens": ids}


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(resources.files("scratchlm.serve").joinpath("static/chat.html").read_text("utf-8"))

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "draining" if state.draining else "ok", "model": state.model_name,
                "context_length": state.context, "auth_required": state.api_key is not None,
                **asdict(state.scheduler.stats)}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

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

    add_api_routes(app, state)
