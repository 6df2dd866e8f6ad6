"""Start the server from a checkpoint directory: load model + tokenizer, bind, run uvicorn.

The socket is bound here (127.0.0.1 unless told otherwise) before uvicorn starts, so `port=0` picks a
free port, and the line printed on start names the real address:
    scratchlm serve: serving 'NAME' on http://HOST:PORT  (chat page: /, API: /v1)
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import uvicorn

from scratchlm.loading import load_pretrained
from scratchlm.serve.server import DEFAULT_MAX_BODY_BYTES, create_app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); a clear ValueError when the address cannot be used."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} is not a TCP port; use 0..65535 (0 = any free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def check_device(device: str) -> None:
    """ValueError for a device string torch does not know, or CUDA asked for where there is none."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device} asked for CUDA but no CUDA GPU is visible; use --device cpu")


def default_model_name(checkpoint: Path) -> str:
    """The checkpoint directory's name (for a training run's OUT/checkpoint, the name of OUT); a .gguf file's stem."""
    path = checkpoint.resolve()
    if path.is_file():
        return path.name.removesuffix(".gguf")
    return path.parent.name if path.name == "checkpoint" and path.parent.name else path.name


def run_server(checkpoint: str | Path, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               model_name: str | None = None, max_batch: int = 32,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, device: str = "cpu", decode: str = "fast") -> None:
    """Serve the model at `checkpoint` (a scratchlm or HF model dir, or a .gguf file) until stopped."""
    checkpoint = Path(checkpoint)
    check_device(device)
    loaded = load_pretrained(checkpoint, device=device)
    model, tokenizer = loaded.model, loaded.tokenizer
    name = model_name or default_model_name(checkpoint)
    app = create_app(model, tokenizer, name, api_key=api_key, max_body_bytes=max_body_bytes, max_batch=max_batch,
                     decode=decode)
    sock = bind_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"scratchlm serve: serving '{name}' on http://{shown}:{sock.getsockname()[1]}  (chat page: /, API: /v1)",
          flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
