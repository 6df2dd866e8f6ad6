"""Prometheus metrics (`GET /metrics`, text exposition format, via prometheus-client) and the access log.

Each app has its own CollectorRegistry (several servers may live in one process, e.g. in tests):
    scratchlm_queue_depth                 gauge      sequences waiting for a batch row
    scratchlm_running_rows                gauge      sequences in the running batch
    scratchlm_tokens_per_second           gauge      tokens chosen per second over the last 10 s
    scratchlm_generated_tokens_total      counter    completion tokens of finished requests
    scratchlm_prompt_tokens_total         counter    prompt tokens of finished requests
    scratchlm_prefix_cache_hit_tokens_total counter  prompt tokens whose K/V came from the prefix cache
    scratchlm_requests_total{endpoint,status}  counter
    scratchlm_time_to_first_token_seconds histogram  request start -> first text
    scratchlm_request_latency_seconds     histogram  request start -> last byte
The access log is one line per request on the "scratchlm.serve.access" logger:
    127.0.0.1:50432 "POST /v1/chat/completions" 200 0.412s prompt=31 completion=64 cached=16 ttft=0.050s
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from scratchlm.serve.scheduler import Scheduler

access_log = logging.getLogger("scratchlm.serve.access")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    def __init__(self, scheduler: Scheduler) -> None:
        self.registry = r = CollectorRegistry()
        Gauge("scratchlm_queue_depth", "sequences waiting for a batch row", registry=r).set_function(
            lambda: len(scheduler.waiting))
        Gauge("scratchlm_running_rows", "sequences in the running batch", registry=r).set_function(
            lambda: scheduler.stats.active)
        Gauge("scratchlm_tokens_per_second", "tokens chosen per second over the last 10 s", registry=r).set_function(
            scheduler.tokens_per_second)
        self.generated = Counter("scratchlm_generated_tokens", "completion tokens of finished requests", registry=r)
        self.prompt = Counter("scratchlm_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.cached = Counter("scratchlm_prefix_cache_hit_tokens", "prompt tokens served from the prefix cache",
                              registry=r)
        self.requests = Counter("scratchlm_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.ttft = Histogram("scratchlm_time_to_first_token_seconds", "request start to first text",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("scratchlm_request_latency_seconds", "request start to last byte",
                                 buckets=LATENCY_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def observe(self, scope: dict[str, Any], status: int, seconds: float) -> None:
        """One finished HTTP request: counters, histograms and the access log line."""
        info = scope.get("state", {}).get("usage") or {}
        path = scope.get("path", "")
        endpoint = path if path.startswith("/v1/") or path in ("/", "/health", "/metrics", "/tokenize") else "other"
        self.requests.labels(endpoint, str(status)).inc()
        if path.startswith("/v1/") and scope.get("method") == "POST":
            self.latency.observe(seconds)
        if info.get("ttft") is not None:
            self.ttft.observe(info["ttft"])
        self.generated.inc(info.get("completion", 0))
        self.prompt.inc(info.get("prompt", 0))
        self.cached.inc(info.get("cached", 0))
        client = scope.get("client") or ("-", 0)
        extra = "".join(f" {k}={v}" for k, v in (("prompt", info.get("prompt")), ("completion", info.get("completion")),
                                                 ("cached", info.get("cached"))) if v is not None)
        ttft = "" if info.get("ttft") is None else f" ttft={info['ttft']:.3f}s"
        access_log.info('%s:%s "%s %s" %d %.3fs%s%s', client[0], client[1], scope.get("method"), path, status,
                        seconds, extra, ttft)
