"""Serving under load: step-level batching vs serialised one-by-one serving, same server, same run.

Builds a servable checkpoint (BPE trained on the head of ../shared/data/tinyshakespeare.txt + a random
llama-tiny model, D 128, 4 layers) unless --checkpoint is given, then starts `scratchlm serve` twice on
free loopback ports: with --max-batch 32 (continuous batching) and --max-batch 1 (each request runs
alone: the serialised baseline a naive server gives). Each gets the same load: C concurrent streaming
clients x R greedy requests of --max-tokens tokens. Prints one JSON object:
    {"batched": {requests, errors, p50_s, p99_s, ttft_p50_s, tok_s, ...}, "serialised": {...},
     "tok_s_ratio": batched / serialised, "p50_ratio": serialised / batched, ...}
    python benchmarks/serve_load.py [--clients 32] [--requests 4] [--max-tokens 32] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from scratchlm.serve.loadgen import run_load
from scratchlm.serve.scheduler import SERVE_DECODE_MODES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
PROMPTS = ["First Citizen:\n", "ROMEO:", "To be, or not", "KING HENRY", "O, what a rogue", "Now is the winter"]


def build_checkpoint(directory: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(directory, DATA / "tinyshakespeare.txt", corpus_bytes=200_000, vocab_size=512,
                                 d_model=128, n_layers=4, max_seq_len=256, init_std=0.02)


def start_server(checkpoint: Path, max_batch: int, threads: int, decode: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "scratchlm.cli.main", "serve", "--checkpoint", str(checkpoint), "--port", "0",
           "--model-name", "bench", "--max-batch", str(max_batch), "--threads", str(threads), "--decode", decode]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if " on " not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    url = line.split(" on ", 1)[1].split()[0]
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server at {url} never answered")


def measure(checkpoint: Path, max_batch: int, args: argparse.Namespace) -> dict:
    proc, url = start_server(checkpoint, max_batch, args.threads, args.decode)
    try:
        asyncio.run(run_load(url + "/v1", "bench", PROMPTS, 2, 1, 4))  # warm-up
        report = asyncio.run(run_load(url + "/v1", "bench", PROMPTS, args.clients, args.requests, args.max_tokens,
                                      timeout_s=args.timeout))
        out = report.summary()
        health = httpx.get(url + "/health").json()
        out["mean_decode_batch"] = round(health["decode_rows"] / max(health["steps"], 1), 1)
        out["max_decode_batch"] = health["max_active"]
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server (the client needs a core)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--decode", choices=SERVE_DECODE_MODES, default="fast", help="the server's decode step")
    ap.add_argument("--checkpoint", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or build_checkpoint(Path(tmp) / "bench")
        batched = measure(checkpoint, 32, args)
        serial = measure(checkpoint, 1, args)
    result = {
        "benchmark": "serve_load", "clients": args.clients, "requests_per_client": args.requests,
        "max_tokens": args.max_tokens, "server_threads": args.threads, "decode": args.decode,
        "batched": batched, "serialised": serial,
        "tok_s_ratio": round(batched["tok_s"] / max(serial["tok_s"], 1e-9), 2),
        "p50_ratio": round(serial["p50_s"] / max(batched["p50_s"], 1e-9), 2),
        "p99_ratio": round(serial["p99_s"] / max(batched["p99_s"], 1e-9), 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
