"""A bounded load generator for the server: C concurrent streaming clients x R requests each.

Every request streams /v1/completions (SSE) and counts as an error unless it answers 200, every
line parses, a finish_reason arrives and the stream ends with `data: [DONE]`. Reported:
    requests, errors, p50_s / p99_s (whole-request latency), ttft_p50_s / ttft_p99_s (time to the first text or finish),
    tok_s = completion tokens (from the usage chunk) / wall time, wall_s
The whole run is bounded by `timeout_s`; requests still open then are counted as errors.
Only ever point it at a server you run yourself (loopback).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamResult:
    prompt: str
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    done: bool = False
    latency_s: float = 0.0
    ttft_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done and self.finish_reason is not None


@dataclass
class LoadReport:
    results: list[StreamResult] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        lat = sorted(r.latency_s for r in self.results if r.ok)
        ttft = sorted(r.ttft_s for r in self.results if r.ok and r.ttft_s is not None)
        tokens = sum(r.completion_tokens for r in self.results if r.ok)
        return {
            "requests": len(self.results), "errors": sum(not r.ok for r in self.results),
            "p50_s": round(percentile(lat, 50), 4), "p99_s": round(percentile(lat, 99), 4),
            "ttft_p50_s": round(percentile(ttft, 50), 4), "ttft_p99_s": round(percentile(ttft, 99), 4),
            "tok_s": round(tokens / max(self.wall_s, 1e-9), 1),
            "completion_tokens": tokens, "wall_s": round(self.wall_s, 3),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list: the value at rank ceil(q/100 * n) (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values), max(1, math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


async def stream_one(http: Any, api: str, headers: dict[str, str], body: dict[str, Any]) -> StreamResult:
    """One streamed completion (or chat completion, when the body has messages), checked line by line."""
    chat = "messages" in body
    res = StreamResult(prompt=body["messages"][-1]["content"] if chat else body["prompt"])
    t0 = time.perf_counter()
    try:
        async with http.stream("POST", api + ("/chat/completions" if chat else "/completions"), json=body,
                               headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line:
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    res.done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                if chunk.get("usage"):
                    res.completion_tokens = chunk["usage"]["completion_tokens"]
                for c in chunk.get("choices", []):
                    text = (c.get("delta") or {}).get("content") or "" if chat else c["text"]
                    if (text or c["finish_reason"]) and res.ttft_s is None:  # the first token, even a stop
                        res.ttft_s = time.perf_counter() - t0
                    res.text += text
                    res.finish_reason = c["finish_reason"] or res.finish_reason
    except Exception as exc:  # a load test counts every failure; it must not stop the run
        res.error = f"{type(exc).__name__}: {exc}"
    res.latency_s = time.perf_counter() - t0
    return res


async def run_load(api: str, model: str, prompts: list[str], clients: int = 32, requests_per_client: int = 3,
                   max_tokens: int = 16, api_key: str | None = None, timeout_s: float = 300.0,
                   extra: dict[str, Any] | None = None) -> LoadReport:
    """Run clients x requests_per_client streamed requests (client c, request i uses prompt (c + i) % len)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = LoadReport()
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)

    async def client(c: int, http: Any) -> None:
        for i in range(requests_per_client):
            body = {"model": model, "prompt": prompts[(c + i) % len(prompts)], "max_tokens": max_tokens,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
            report.results.append(await stream_one(http, api, headers, body))

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as http:
        tasks = [asyncio.create_task(client(c, http)) for c in range(clients)]
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
    report.wall_s = time.perf_counter() - t0
    missing = clients * requests_per_client - len(report.results)
    report.results += [StreamResult(prompt="", error="timed out") for _ in range(missing)]
    return report
