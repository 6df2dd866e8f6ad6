"""Graceful shutdown: streams that cannot finish within --shutdown-timeout end with an error chunk, their
finish chunk and `data: [DONE]` (none is cut mid-way), queued ones too, and the server then stops.
The server runs in-process on a slowed model (20 ms per forward) so that the streams certainly outlast the
timeout; the shutdown is triggered the way uvicorn's SIGTERM handler does it (should_exit)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from scratchlm.serve.launch import GracefulServer
from scratchlm.serve.server import create_app

from inprocess import byte_model, get_json, serve_in_thread, wait_until

TIMEOUT = 0.5


def read_stream(url: str) -> list[str]:
    body = {"model": "m", "prompt": "abc", "max_tokens": 100, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_shutdown_ends_every_stream_with_an_error_chunk_and_done():
    model, tok = byte_model(max_seq_len=128, delay=0.02)
    app = create_app(model, tok, "m", max_batch=2)
    with serve_in_thread(app, GracefulServer, state=app.state.serve, shutdown_timeout=TIMEOUT) as (url, server):
        with ThreadPoolExecutor(5) as pool:
            streams = [pool.submit(read_stream, url) for _ in range(5)]
            wait_until(lambda: (h := get_json(url + "/health"))["active"] == 2 and h["waiting"] == 3)
            server.should_exit = True  # what uvicorn's SIGTERM / SIGINT handler does
            results = [f.result(timeout=60) for f in streams]
    # no timing assert: that the timeout (not the streams' natural end) stopped them is the error finish below
    for lines in results:
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        errors = [c["error"] for c in chunks if "error" in c]
        assert len(errors) == 1 and errors[0]["code"] == "server_shutting_down"
        assert "shutting down" in errors[0]["message"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "error"
