"""Serving under load, and what the server's features cost, each measured side by side with its peer.

Builds a servable checkpoint (BPE trained on the head of ../shared/data/tinyshakespeare.txt + a random
llama-tiny model, D 128, 4 layers, 2048-token context) unless --checkpoint is given, and starts
`scratchlm serve` on free loopback ports. Every phase first waits for a quiet machine (quiet.py).

    load          C streaming clients x R greedy requests (default 64 x 10, --max-tokens 32) on the batched
                  server: errors, p50/p99 latency and TTFT, tokens/s, mean decode batch, the server's RSS
                  before/after (growth = a leak). Peer: the same server with --max-batch 1 (requests served
                  one by one) under C clients x --serial-requests, for the tokens/s ratio.
    prefix_cache  sequential chat requests sharing a long system prompt (~--system-tokens tokens), each with
                  its own question: TTFT p50 with the prefix cache vs a server started with
                  --prefix-cache-mb 0, and whether the greedy replies are identical.
    logprobs      time per token (latency / tokens) of one stream, plain vs logprobs + top_logprobs 5, and
                  of each of 16 concurrent streams
    structured    the same for response_format json_object and a json_schema (after a warm-up request that
                  builds the vocabulary index and the grammar)
Prints one JSON object (last line).
    python benchmarks/serve_load.py [--clients 64] [--requests 10] [--max-tokens 32] [--checkpoint DIR]
                                    [--max-context 2048]
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
from statistics import median
from typing import Any

import httpx

from scratchlm.serve.scheduler import SERVE_DECODE_MODES

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))  # the test suite's load generator
from loadgen import run_load, stream_one  # noqa: E402
from quiet import wait_quiet  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
PROMPTS = ["First Citizen:\n", "ROMEO:", "To be, or not", "KING HENRY", "O, what a rogue", "Now is the winter"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "lines": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "lines"]}
QUIET: dict[str, Any] = {}
QUIET_TIMEOUT = [30.0]  # --quiet-timeout


def build_checkpoint(directory: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(directory, DATA / "tinyshakespeare.txt", corpus_bytes=200_000, vocab_size=512,
                                 d_model=128, n_layers=4, max_seq_len=2048, init_std=0.02)


class Server:
    """`scratchlm serve` in a subprocess on a free port."""

    def __init__(self, checkpoint: Path, args: argparse.Namespace, *extra: str) -> None:
        cmd = [sys.executable, "-m", "scratchlm.cli.main", "serve", "--checkpoint", str(checkpoint), "--port", "0",
               "--model-name", "bench", "--threads", str(args.threads), "--decode", args.decode, "--no-access-log",
               *(["--max-context", str(args.max_context)] if args.max_context else []), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if " on " not in line:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = line.split(" on ", 1)[1].split()[0]
        self.api = self.url + "/v1"
        for _ in range(600):
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"server at {self.url} never answered")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def load_phase(server: Server, clients: int, requests: int, args: argparse.Namespace) -> dict[str, Any]:
    asyncio.run(run_load(server.api, "bench", PROMPTS, 4, 2, 8))  # warm-up
    before, rss0 = server.health(), server.rss_mb()
    wait_quiet(timeout_s=QUIET_TIMEOUT[0], stats=QUIET)
    report = asyncio.run(run_load(server.api, "bench", PROMPTS, clients, requests, args.max_tokens,
                                  timeout_s=args.timeout))
    out = report.summary()
    after = server.health()
    steps = max(after["steps"] - before["steps"], 1)
    out["mean_decode_batch"] = round((after["decode_rows"] - before["decode_rows"]) / steps, 1)
    out["rss_mb_before"], out["rss_mb_after"] = round(rss0, 1), round(server.rss_mb(), 1)
    out["rss_growth_mb"] = round(out["rss_mb_after"] - rss0, 1)
    return out


async def sequential(api: str, bodies: list[dict]) -> list[Any]:
    async with httpx.AsyncClient(timeout=300) as http:
        return [await stream_one(http, api, {}, {**b, "stream": True}) for b in bodies]


def system_prompt(url: str, tokens: int) -> str:
    """About `tokens` tokens of Shakespeare (the server's /tokenize counts them)."""
    text = DATA.joinpath("tinyshakespeare.txt").read_text()[200_000:]
    chars = tokens * 2
    for _ in range(8):
        count = httpx.post(url + "/tokenize", json={"prompt": text[:chars]}, timeout=60).json()["count"]
        chars = int(chars * tokens / max(count, 1))
    return text[:chars]


def prefix_phase(checkpoint: Path, args: argparse.Namespace) -> dict[str, Any]:
    with Server(checkpoint, args) as server:
        system = system_prompt(server.url, args.system_tokens)
    questions = [f"Question {i}: who speaks next, and why?" for i in range(args.prefix_requests)]
    bodies = [{"model": "bench", "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
               "max_tokens": 8, "temperature": 0} for q in questions]
    out: dict[str, Any] = {}
    texts = {}
    for name, extra in (("cached", ()), ("uncached", ("--prefix-cache-mb", "0"))):
        with Server(checkpoint, args, *extra) as server:
            asyncio.run(sequential(server.api, bodies[:1]))  # warm-up; fills the cache with the system prompt
            wait_quiet(timeout_s=QUIET_TIMEOUT[0], stats=QUIET)
            results = asyncio.run(sequential(server.api, bodies[1:]))
            failed = [r.error for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{len(failed)} prefix-cache requests failed: {failed[0]}")
            out[f"ttft_p50_s_{name}"] = round(median(r.ttft_s for r in results), 4)
            texts[name] = [r.text for r in results]
            out[f"cached_prompt_tokens_{name}"] = server.health()["cached_prompt_tokens"]
    out["system_tokens"] = args.system_tokens
    out["ttft_ratio"] = round(out["ttft_p50_s_uncached"] / max(out["ttft_p50_s_cached"], 1e-9), 2)
    out["greedy_identical"] = texts["cached"] == texts["uncached"]
    return out


def per_token(api: str, body: dict, streams: int, repeats: int) -> float:
    """Median of latency / completion tokens over `streams` concurrent streams, `repeats` times (the prompt is
    short, so this is the decode time per token as a client sees it)."""
    async def one_round(http: httpx.AsyncClient) -> list[Any]:
        return await asyncio.gather(*(stream_one(http, api, {}, {**body, "stream": True, "seed": s,
                                                                   "stream_options": {"include_usage": True}})
                                      for s in range(streams)))

    async def run() -> list[float]:
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=streams + 4)) as http:
            await one_round(http)  # warm-up
            values = []
            wait_quiet(timeout_s=QUIET_TIMEOUT[0], stats=QUIET)
            for _ in range(repeats):
                rs = await one_round(http)
                failed = [r.error for r in rs if not r.ok]
                if failed:
                    raise RuntimeError(f"{len(failed)} of {len(rs)} requests failed: {failed[0]}")
                values += [r.latency_s / r.completion_tokens for r in rs]  # short prompt: ~all decoding
            return values

    return median(asyncio.run(run()))


def overhead_phase(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    base = {"model": "bench", "messages": [{"role": "user", "content": "Tell me about ROMEO."}],
            "max_tokens": args.overhead_tokens, "temperature": 0.8}
    variants = {"plain": {}, "logprobs": {"logprobs": True, "top_logprobs": 5},
                "json_object": {"response_format": {"type": "json_object"}},
                "json_schema": {"response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "p", "schema": SCHEMA}}}}
    out: dict[str, Any] = {}
    for streams in (1, 16):
        ms = {k: per_token(server.api, {**base, **v}, streams, args.overhead_repeats) * 1000
              for k, v in variants.items()}
        out[f"ms_per_token_{streams}_streams"] = {k: round(v, 3) for k, v in ms.items()}
        out[f"overhead_ms_per_token_{streams}_streams"] = {k: round(v - ms["plain"], 3) for k, v in ms.items()
                                                           if k != "plain"}
    return out


def progress(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """Each phase's JSON on stderr as it finishes (a later failure loses nothing)."""
    print(json.dumps({name: result}), file=sys.stderr, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=10, help="requests per client")
    ap.add_argument("--serial-requests", type=int, default=2, help="requests per client for the --max-batch 1 peer")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=1500, help="about how long the shared system prompt is")
    ap.add_argument("--prefix-requests", type=int, default=12)
    ap.add_argument("--overhead-tokens", type=int, default=64)
    ap.add_argument("--overhead-repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server (the client needs a core)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--decode", choices=SERVE_DECODE_MODES, default="fast", help="the server's decode step")
    ap.add_argument("--checkpoint", type=Path, default=None, help="a model to serve instead (e.g. the SmolLM2 GGUF)")
    ap.add_argument("--max-context", type=int, default=None,
                    help="the servers' --max-context (a big model's KV cache is --max-batch x its context)")
    ap.add_argument("--quiet-timeout", type=float, default=30.0, help="longest wait for a quiet machine per phase")
    args = ap.parse_args()
    QUIET_TIMEOUT[0] = args.quiet_timeout
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or build_checkpoint(Path(tmp) / "bench")
        with Server(checkpoint, args) as server:
            batched = progress("batched", load_phase(server, args.clients, args.requests, args))
            overheads = progress("overheads", overhead_phase(server, args))
        with Server(checkpoint, args, "--max-batch", "1") as server:
            serial = progress("serialised", load_phase(server, args.clients, args.serial_requests, args))
        prefix = progress("prefix_cache", prefix_phase(checkpoint, args))
    import torch

    result = {
        "benchmark": "serve_load", "clients": args.clients, "requests_per_client": args.requests,
        "max_tokens": args.max_tokens, "server_threads": args.threads, "decode": args.decode,
        "torch": torch.__version__, "quiet": QUIET,
        "batched": batched, "serialised": {**serial, "requests_per_client": args.serial_requests},
        "tok_s_ratio": round(batched["tok_s"] / max(serial["tok_s"], 1e-9), 2),
        "prefix_cache": prefix, **overheads,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
