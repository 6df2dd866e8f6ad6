"""Start the server from a checkpoint directory: load model + tokenizer, bind, run uvicorn.

The socket is bound here (127.0.0.1 unless told otherwise) before uvicorn starts, so `port=0` picks a
free port, and the line printed on start names the real address:
    scratchlm serve: serving 'NAME' on http://HOST:PORT  (chat page: /, API: /v1)

Graceful shutdown (SIGTERM / Ctrl-C): the listening socket closes and new requests on open connections
get 503; running and waiting requests have `shutdown_timeout` seconds to finish. Whatever is still
generating then ends with an error chunk (code server_shutting_down), its finish chunk and `data: [DONE]`
(a non-streamed request gets a 503), so no client sees a stream cut mid-way; then the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import uvicorn

from scratchlm.data.chat_format import chat_format_of
from scratchlm.generate.constrained.vocab_index import vocabulary_bytes
from scratchlm.load import load_pretrained
from scratchlm.serve import API_KEY_ENV
from scratchlm.serve.guards import LOOPBACK_HOSTS, is_loopback
from scratchlm.serve.server import create_app
from scratchlm.serve.state import ServeOptions, ServerState

FLUSH_GRACE_S = 3.0  # after the shutdown timeout: time for the error chunks to reach the clients
GIL_SWITCH_S = 0.0005  # sys.setswitchinterval while serving (Python's default 0.005)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); a clear ValueError when the address cannot be used.

    Made with proto IPPROTO_TCP, which the connections it accepts inherit: asyncio turns Nagle off
    (TCP_NODELAY) only on sockets whose proto says TCP. With proto 0 every small write (a streamed token, the
    body after the headers) waited for the client's delayed ACK: +40 ms on each request after the first on a
    kept-alive connection (benchmarks/RESULTS.md)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} is not a TCP port; use 0..65535 (0 = any free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host") from None
    sock.listen(1024)
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


def default_allowed_hosts(host: str, allowed: list[str] | None) -> list[str] | None:
    """--allowed-hosts if given; else the localhost names for a loopback bind, and any host otherwise."""
    if allowed:
        return allowed
    return list(LOOPBACK_HOSTS) if is_loopback(host) else None


def security_warnings(host: str, api_key: str | None) -> list[str]:
    """What to tell the operator before serving (printed to stderr)."""
    if api_key is None and not is_loopback(host):
        return [f"listening on {host} without an API key: anyone who can reach this machine can use the model; "
                f"set {API_KEY_ENV} (or --api-key) to require a key"]
    return []


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose shutdown drains the scheduler first (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.state, self.shutdown_timeout = state, shutdown_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.draining = True
        abort = asyncio.get_running_loop().call_later(
            self.shutdown_timeout, self.state.scheduler.abort,
            f"the server is shutting down; this request did not finish within {self.shutdown_timeout:g} s")
        try:
            await super().shutdown(sockets)
        finally:
            abort.cancel()


def check_same_tokenizer(tokenizer: Any, other: Any, vocab_size: int) -> None:
    """ValueError unless both tokenizers give every token id the same bytes (a draft model must share the
    model's tokenizer: its token ids are checked as the model's)."""
    if vocabulary_bytes(tokenizer, vocab_size) != vocabulary_bytes(other, vocab_size):
        raise ValueError("--draft-model has another tokenizer than the served model; speculative decoding needs a "
                         "draft model of the same tokenizer (e.g. a smaller model of the same family)")


def configure_logging(access_log: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("scratchlm")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("scratchlm.serve.access").disabled = not access_log


def run_server(checkpoint: str | Path, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
               device: str = "cpu", shutdown_timeout: float = 10.0, access_log: bool = True,
               options: ServeOptions | None = None, dtype: torch.dtype | None = None,
               attn_impl: str = "sdpa") -> None:
    """Serve the model at `checkpoint` (a scratchlm or HF model dir, or a .gguf file) until stopped; dtype None:
    as stored (a GGUF on its own blocks), else a dense copy in that dtype; attn_impl: the model's attention
    (ModelConfig.attn_impl: "sdpa" = torch's fused kernel, "reference" = our math)."""
    options = options or ServeOptions()
    checkpoint = Path(checkpoint)
    if shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout {shutdown_timeout} must be >= 0 seconds")
    check_device(device)
    loaded = load_pretrained(checkpoint, device=device, dtype=dtype, attn_impl=attn_impl)
    model, tokenizer = loaded.model, loaded.tokenizer
    if isinstance(options.draft_model, (str, Path)):  # `serve --draft-model PATH`: load it like the model
        draft = load_pretrained(options.draft_model, device=device, dtype=dtype, attn_impl=attn_impl)
        check_same_tokenizer(tokenizer, draft.tokenizer, model.config.vocab_size)
        options.draft_model = draft.model
    name = model_name or default_model_name(checkpoint)
    options.allowed_hosts = default_allowed_hosts(host, options.allowed_hosts)
    fmt = chat_format_of(loaded)  # the model's own chat template, or None for scratchlm's ChatML
    stops = [*loaded.stop_token_ids, *([fmt.reply_end_id] if fmt.reply_end_id is not None else [])]
    app = create_app(model, tokenizer, name, options, stop_token_ids=list(dict.fromkeys(stops)),
                     chat_template=fmt.template)
    sock = bind_socket(host, port)
    configure_logging(access_log)
    for warning in security_warnings(host, options.api_key):
        print(f"scratchlm serve: warning: {warning}", file=sys.stderr, flush=True)
    print(f"scratchlm serve: {app.state.serve.kv_summary()}", file=sys.stderr, flush=True)
    shown = f"[{host}]" if ":" in host else host
    print(f"scratchlm serve: serving '{name}' on http://{shown}:{sock.getsockname()[1]}  (chat page: /, API: /v1)",
          flush=True)
    # the scheduler thread runs a step with the GIL released (kernels, torch ops) while the event loop streams;
    # when the step returns it waits for the loop to hand the GIL back, by default up to 5 ms per token
    sys.setswitchinterval(GIL_SWITCH_S)
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=shutdown_timeout + FLUSH_GRACE_S)
    GracefulServer(config, app.state.serve, shutdown_timeout).run(sockets=[sock])
