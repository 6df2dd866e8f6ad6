"""Servers inside the test process: uvicorn on a free loopback port in a thread (real HTTP, real event loop),
for tests that need a model they control (one that blocks, fails or is slow) or the server object itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import torch
import uvicorn

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.serve.launch import bind_socket
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer


class GatedModel(TransformerLM):
    """A TransformerLM whose forward waits for `gate` (when armed) and can be slowed by `delay` seconds per call;
    `entered` is set when a forward starts waiting."""

    def setup_gate(self, delay: float = 0.0) -> "GatedModel":
        self.gate, self.entered, self.armed, self.delay = threading.Event(), threading.Event(), False, delay
        return self

    def forward(self, *args, **kwargs):
        if self.armed:
            self.entered.set()
            self.gate.wait(30)
        if self.delay:
            time.sleep(self.delay)
        return super().forward(*args, **kwargs)


def byte_model(max_seq_len: int = 64, delay: float = 0.0) -> tuple[GatedModel, Tokenizer]:
    """A random llama-tiny over a byte vocabulary (256 bytes + the 3 ChatML specials)."""
    torch.manual_seed(0)
    config = get_preset("llama-tiny", vocab_size=259, d_model=32, n_layers=1, max_seq_len=max_seq_len, init_std=0.5)
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    return GatedModel(config).eval().setup_gate(delay), tok


@contextmanager
def serve_in_thread(app, server_cls: type = uvicorn.Server, **server_args) -> Iterator[tuple[str, uvicorn.Server]]:
    """Run `app` on http://127.0.0.1:PORT in a thread; yields (url, server); stops it on exit."""
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    server = server_cls(config, **server_args)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield url, server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def get_json(url: str, **kw) -> dict:
    r = httpx.get(url, timeout=30, **kw)
    r.raise_for_status()
    return r.json()
