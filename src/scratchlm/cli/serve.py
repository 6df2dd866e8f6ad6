"""`scratchlm serve`: an OpenAI-compatible API server and chat page for a checkpoint."""

from __future__ import annotations

import argparse

from scratchlm.serve.scheduler import SERVE_DECODE_MODES  # torch only; fastapi/uvicorn stay lazy


def run_serve(args: argparse.Namespace) -> int:
    from scratchlm.serve.launch import run_server  # fastapi/uvicorn are imported only for this command

    limits = {} if args.max_body_bytes is None else {"max_body_bytes": args.max_body_bytes}
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} must be >= 1")
        import torch

        torch.set_num_threads(args.threads)
    run_server(args.checkpoint, args.host, args.port, args.api_key, args.model_name, args.max_batch, **limits,
               device=args.device, decode=args.decode)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a checkpoint over an OpenAI-compatible HTTP API (+ a chat page at /)",
        description="Serve a model (a scratchlm checkpoint dir, an HF model dir or a .gguf file) with /v1/models, "
        "/v1/completions and /v1/chat/completions (streaming, batched). Binds 127.0.0.1 unless --host says otherwise.",
    )
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="model: a scratchlm checkpoint dir, an HF model dir or a .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)")
    p.add_argument("--model-name", default=None, help="the model id clients send (default: the directory name)")
    p.add_argument("--max-batch", type=int, default=32, help="most sequences decoded together (default 32)")
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="largest request body accepted (default 1 MiB; 413 beyond)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu; e.g. cuda)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--decode", choices=SERVE_DECODE_MODES, default="fast",
                   help="decode step: fast = packed weights, same output as the model (default); model = the "
                        "reference forward; fast-int8 = int8 weight-only (approximate)")
    p.set_defaults(func=run_serve)
