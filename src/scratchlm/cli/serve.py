"""`scratchlm serve`: an OpenAI-compatible API server and chat page for a checkpoint."""

from __future__ import annotations

import argparse
import os

from scratchlm.cli.generate import DTYPES, add_speculative_args
from scratchlm.generate.prefill import PREFILL_MODES
from scratchlm.serve import API_KEY_ENV
from scratchlm.serve.kv_space import DEFAULT_KV_CACHE_MB
from scratchlm.serve.scheduler import SERVE_DECODE_MODES  # torch only; fastapi/uvicorn stay lazy


def names(text: str) -> list[str]:
    """A comma-separated flag value as a list ("a, b" -> ["a", "b"])."""
    out = [t.strip() for t in text.split(",") if t.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names, got {text!r}")
    return out


def resolve_api_key(flag: str | None, env: dict[str, str]) -> str | None:
    """--api-key wins; else $SCRATCHLM_API_KEY (keeps the key out of `ps`); empty means none."""
    key = flag if flag is not None else env.get(API_KEY_ENV)
    return key or None


def run_serve(args: argparse.Namespace) -> int:
    from scratchlm.serve.launch import run_server  # fastapi/uvicorn are imported only for this command
    from scratchlm.serve.state import DEFAULT_MAX_BODY_BYTES, ServeOptions

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} must be >= 1")
        import torch

        torch.set_num_threads(args.threads)
    if args.max_queue < 0:
        raise ValueError(f"--max-queue {args.max_queue} must be >= 0 (0: refuse with 429 whenever every row is busy)")
    options = ServeOptions(
        api_key=resolve_api_key(args.api_key, dict(os.environ)), max_batch=args.max_batch, decode=args.decode,
        prefill=args.prefill,
        max_body_bytes=DEFAULT_MAX_BODY_BYTES if args.max_body_bytes is None else args.max_body_bytes,
        max_queue=args.max_queue, prefix_cache_mb=args.prefix_cache_mb, allowed_hosts=args.allowed_hosts,
        allowed_origins=args.allowed_origins, max_context=args.max_context, kv_cache_mb=args.kv_cache_mb,
        kv_cache_tokens=args.kv_cache_tokens, prefill_chunk=args.prefill_chunk,
        speculative="draft" if args.draft_model and args.speculative is None else args.speculative,
        draft_model=args.draft_model, draft_tokens=args.draft_tokens)
    run_server(args.checkpoint, args.host, args.port, args.model_name, device=args.device, dtype=DTYPES[args.dtype],
               attn_impl=args.attn, shutdown_timeout=args.shutdown_timeout, access_log=not args.no_access_log, options=options)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a checkpoint over an OpenAI-compatible HTTP API (+ a chat page at /)",
        description="Serve a model (a scratchlm checkpoint dir, an HF model dir or a .gguf file) with /v1/models, "
        "/v1/completions and /v1/chat/completions (streaming, batched), /tokenize, /health and /metrics. "
        "Binds 127.0.0.1 unless --host says otherwise.",
    )
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="model: a scratchlm checkpoint dir, an HF model dir or a .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/* (401 otherwise); default: ${API_KEY_ENV}, "
                        "which keeps the key out of the process list")
    p.add_argument("--model-name", default=None, help="the model id clients send (default: the directory name)")
    p.add_argument("--max-batch", type=int, default=32, help="most sequences decoded together (default 32)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="most sequences waiting for a batch row; beyond it requests get 429 + Retry-After (default 256)")
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="largest request body accepted (default 1 MiB; 413 beyond)")
    p.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                   help="serve at most this many tokens per sequence (prompt + reply; default: the model's context, "
                        "or what the K/V pool holds when that is less)")
    p.add_argument("--kv-cache-mb", type=float, default=DEFAULT_KV_CACHE_MB,
                   help="the K/V memory: one pool of 16-token blocks shared by every sequence, used as they grow "
                        f"(default {DEFAULT_KV_CACHE_MB:.0f}; capped at --max-batch x the context). When it is full, "
                        "requests wait (then 429 once --max-queue are waiting)")
    p.add_argument("--kv-cache-tokens", type=int, default=None, metavar="TOKENS",
                   help="the K/V pool as a token budget instead of --kv-cache-mb")
    p.add_argument("--prefill-chunk", type=int, default=512, metavar="TOKENS",
                   help="prompt tokens prefilled per step at most: a long prompt is prefilled in chunks between "
                        "the running streams' decode steps (default 512)")
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory for the K/V of shared prompt prefixes, reused across requests (default 256; 0 = off)")
    add_speculative_args(p)  # --speculative, --draft-model, --draft-tokens (per stream here)
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="on SIGTERM, seconds running requests get to finish before they end with an error (default 10)")
    p.add_argument("--allowed-hosts", type=names, default=None,
                   help="comma-separated Host names the server answers (default: localhost, 127.0.0.1, [::1] when "
                        "bound to loopback, any otherwise; '*' = any). Guards against DNS rebinding")
    p.add_argument("--allowed-origins", type=names, default=None,
                   help="comma-separated browser origins allowed to call the API cross-site (CORS; default: none)")
    p.add_argument("--no-access-log", action="store_true", help="do not log one line per request to stderr")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu; e.g. cuda)")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="weights: auto = as stored (a .gguf is served from its own quantized blocks, memory ~ the "
                        "file; other models fp32; default); fp32 / bf16 = a dense copy in that dtype")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--attn", choices=["reference", "sdpa"], default="sdpa",
                   help="attention of the prefill and the model forward: sdpa = torch's fused kernel (default, as "
                        "generate; ~4x faster on a 2k-token prompt), reference = our math")
    p.add_argument("--decode", choices=SERVE_DECODE_MODES, default="auto",
                   help="decode step: auto = the fastest exact one (fast-gguf on a GGUF's blocks, else fast; "
                        "default); fast = packed weights, same output as the model; model = the "
                        "reference forward; fast-int8 = int8 weight-only (approximate)")
    p.add_argument("--prefill", choices=PREFILL_MODES, default="model",
                   help="prompt prefill: model = in the model's dtype (default); bf16 = through a bf16 copy "
                        "(faster on CPUs with bf16 units; bf16 rounding in the prompt's K/V), as `generate --prefill`")
    p.set_defaults(func=run_serve)
