"""Serve test fixtures: a tiny checkpoint built once, and the real server started on a free loopback port.

The server runs as `SCRATCHLM_API_KEY=KEY python -m scratchlm.cli.main serve --checkpoint DIR --port 0` in
a subprocess (exactly what a user runs); the URL is read from the line it prints on start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from scratchlm.serve import API_KEY_ENV
from serve_helpers import wait_for_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_checkpoint import API_KEY, MAX_BODY, MODEL, build_tiny_checkpoint  # noqa: E402


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    checkpoint: Path
    process: subprocess.Popen

    @property
    def log(self) -> str:
        return (self.checkpoint.parent / "server.log").read_text()

    @property
    def api(self) -> str:
        return self.url + "/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def health(self) -> dict:
        r = httpx.get(self.url + "/health", timeout=10)
        r.raise_for_status()
        return r.json()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The test process and the server share 2 cores: one intra-op thread each avoids OpenMP spinning
    against each other (measured 30x slower tiny-model steps when oversubscribed)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("serve") / MODEL, shared_data / "tinyshakespeare.txt")


@pytest.fixture(scope="session")
def server(tiny_checkpoint: Path) -> LiveServer:
    cmd = [sys.executable, "-m", "scratchlm.cli.main", "serve", "--checkpoint", str(tiny_checkpoint), "--port", "0",
           "--max-body-bytes", str(MAX_BODY), "--threads", "1"]
    log = open(tiny_checkpoint.parent / "server.log", "w")  # stderr to a file: a full pipe would block the server
    env = {**os.environ, API_KEY_ENV: API_KEY}  # the key from the environment: not visible in `ps`
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        yield LiveServer(wait_for_url(process, 120), tiny_checkpoint, process)
    finally:
        log.close()
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def reference(tiny_checkpoint: Path):
    """The same model and tokenizer loaded in-process, for reference outputs from the generation engine."""
    from scratchlm.model_files import load_model
    from scratchlm.tokenizer import Tokenizer

    return load_model(tiny_checkpoint).eval(), Tokenizer.load(tiny_checkpoint)
