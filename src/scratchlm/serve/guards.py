"""The outermost ASGI layer: Host allow-list, then the access log and metrics of every request.

DNS rebinding: a web page on evil.example can point its own name at 127.0.0.1 and then talk to a
loopback server from the victim's browser, sending `Host: evil.example`. A server that answers only
the host names it expects (for a loopback bind: localhost, 127.0.0.1, [::1]) defeats it; `--allowed-hosts`
names others ("*" = any). JSON-only request bodies (checked where the body is read) stop the other
browser trick, a cross-site "simple" POST with `Content-Type: text/plain`, which needs no CORS preflight.
"""

from __future__ import annotations

import json
import time
from typing import Any, Awaitable, Callable

from scratchlm.serve.prometheus import ServerMetrics
from scratchlm.serve.protocol import APIError

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ASGIApp = Callable[[dict, Callable, Callable], Awaitable[None]]


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")


def host_name(header: str) -> str:
    """The host part of a Host header: "[::1]:8000" -> "[::1]", "Example.com:80" -> "example.com"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class GuardMiddleware:
    """Refuses requests whose Host is not allowed (400), and records every request (log line + metrics)."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str] | None, metrics: ServerMetrics) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None or "*" in allowed_hosts else {h.lower() for h in allowed_hosts}
        self.metrics = metrics

    def _host_error(self, scope: dict[str, Any]) -> APIError | None:
        if self.allowed is None:
            return None
        raw = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        name = host_name(raw)
        if name in self.allowed or name.strip("[]") in self.allowed:
            return None
        shown = raw or "(none)"
        return APIError(400, f"the Host header {shown!r} is not allowed by this server; if you reach it under that "
                        f"name, start it with --allowed-hosts {name or 'NAME'}", code="invalid_host")

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        scope.setdefault("state", {})
        status = 500

        async def send_recorded(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            err = self._host_error(scope)
            if err is not None:
                await send_json(send_recorded, err.status, err.body())
                return
            await self.app(scope, receive, send_recorded)
        finally:
            self.metrics.observe(scope, status, time.monotonic() - started)


async def send_json(send: Callable, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())] + extra})
    await send({"type": "http.response.body", "body": data})
