"""`scratchlm serve` side by side with llama.cpp's `llama-server` on the same GGUF, same client (one JSON object).

Model: SmolLM2-135M-Instruct Q4_1 (the real-model fixture) unless --gguf. Servers, one at a time, each a
subprocess on a free loopback port, 2 threads each:
    scratchlm   `scratchlm serve --checkpoint GGUF --threads 2` with its defaults (decode auto = the file's own
                blocks, paged K/V pool, chunked prefill)
    llamacpp    `llama-server -m GGUF -t 2 -np N` (continuous batching; built from the llama.cpp sources vendored
                in the llama-cpp-python 0.3.36 sdist: benchmarks/RESULTS.md has the cmake step; --llama-server)
Every phase first waits for a quiet machine (quiet.py). Streaming chat, temperature 0. Phases:
    load         concurrency 1 / 8 / 32 (llama-server -np C): C clients x --requests each, --max-tokens tokens:
                 tokens/s (completion tokens / wall), TTFT p50/p99, inter-token p99 and the longest stall (gaps
                 between streamed chunks with text), the server's peak RSS and CPU use (cores = CPU s / wall s)
    json_schema  16 streams, plain vs response_format json_schema: ms per token of each stream after its first
                 token ((latency - TTFT) / (tokens - 1), median); overhead = json / plain - 1 (target <= 0.10)
    speculative  1 stream of a code-editing request (return a given function with a name changed): scratchlm
                 --speculative ngram vs without (tokens/s; decode_tok_s after the first token, which the speedup
                 compares: the prompt's prefill is the same work either way; same text?), and llama-server
                 --spec-type ngram-simple vs without
    long_prompt  8 streams decoding when one ~--long-tokens-token prompt arrives: the 8 streams' inter-token p99 and
                 longest stall between its arrival and its first token, and its TTFT; scratchlm with its default
                 --prefill-chunk and unchunked (--prefill-chunk 65536), llama-server -np 9 -c 16384 --kv-unified
Targets (issue #25): tokens/s >= 1.0x llama-server at every concurrency (1.5x at 32), TTFT p99 <= llama-server's,
peak RSS <= llama-server's + 200 MB, json_schema <= +10% per token.
    python benchmarks/serve_llamacpp.py [--llama-server PATH] [--gguf PATH] [--requests 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests"))
from quiet import wait_quiet  # noqa: E402

LLAMA_SERVER = Path("/work/ref/llama-server-build/bin/llama-server")
DATA = ROOT.parent / "shared" / "data"
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
             "Give three tips for learning to code.", "What is a prime number?", "Describe a cat in two sentences.",
             "Why is the sky blue?", "Name four planets and one fact about each."]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "lines": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "lines"]}
CODE = '''def moving_average(values, window):
    """Average of every `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = sum(values[:window])
    out.append(total / window)
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        out.append(total / window)
    return out
'''
QUIET: dict[str, Any] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess: its URL, RSS / peak RSS and CPU seconds from /proc."""

    def __init__(self, kind: str, gguf: Path, args: argparse.Namespace, *extra: str) -> None:
        self.kind = kind
        if kind == "scratchlm":
            cmd = [sys.executable, "-m", "scratchlm.cli.main", "serve", "--checkpoint", str(gguf), "--port", "0",
                   "--model-name", "bench", "--threads", "2", "--no-access-log", *extra]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            line = self.proc.stdout.readline()
            if " on " not in line:
                self.proc.kill()
                raise RuntimeError(f"scratchlm serve did not start: {line!r}")
            self.url = line.split(" on ", 1)[1].split()[0]
        else:
            port = free_port()
            cmd = [str(args.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                   "--no-webui", *extra]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {self.proc.returncode}: {cmd}")
            time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError(f"{kind} never answered /health")

    def _status(self, key: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
        return 0.0

    def peak_rss_mb(self) -> float:
        return round(self._status("VmHWM:"), 1)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def stream_chat(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat completion: TTFT, gaps between text chunks, tokens (usage), text, latency, error."""
    body = {"model": "bench", "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **body}
    t0 = time.perf_counter()
    out: dict[str, Any] = {"ttft": None, "arrivals": [], "tokens": 0, "text": "", "error": None}
    try:
        async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}"
                return out
            async for line in r.aiter_lines():
                data = line.removeprefix("data: ").strip()
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
                for c in chunk.get("choices", []):
                    text = (c.get("delta") or {}).get("content") or ""
                    if text:
                        now = time.perf_counter()
                        out["arrivals"].append(now)
                        out["ttft"] = out["ttft"] if out["ttft"] is not None else now - t0
                        out["text"] += text
    except Exception as exc:  # a benchmark counts failures; it must not stop
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["start"], out["latency"] = t0, time.perf_counter() - t0
    out["tokens"] = out["tokens"] or len(out["arrivals"])
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q / 100 * len(values) + 0.5)) - 1))] if values else 0.0


async def run_clients(url: str, bodies: list[list[dict]], timeout: float = 900) -> tuple[list[dict], float]:
    """len(bodies) concurrent clients, each sending its bodies in turn; (results, wall seconds)."""
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        async def client(mine: list[dict]) -> list[dict]:
            return [await stream_chat(http, url, b) for b in mine]

        t0 = time.perf_counter()
        done = await asyncio.gather(*(client(b) for b in bodies))
    return [r for rs in done for r in rs], time.perf_counter() - t0


def gaps(results: list[dict], lo: float = 0.0, hi: float = float("inf")) -> list[float]:
    """Gaps between consecutive text chunks of each stream whose later chunk arrived in [lo, hi]."""
    return [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:]) if lo <= b <= hi]


def load_phase(server: Server, c: int, args: argparse.Namespace) -> dict[str, Any]:
    chat = lambda i: {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],  # noqa: E731
                      "max_tokens": args.max_tokens}
    asyncio.run(run_clients(server.url, [[chat(i)] for i in range(min(c, 4))]))  # warm-up
    wait_quiet(timeout_s=args.quiet_timeout, stats=QUIET)
    cpu0 = server.cpu_s()
    results, wall = asyncio.run(run_clients(server.url, [[chat(i + j) for j in range(args.requests)] for i in range(c)]))
    ok = [r for r in results if r["error"] is None]
    g = gaps(ok)
    return {"requests": len(results), "errors": len(results) - len(ok),
            "tok_s": round(sum(r["tokens"] for r in ok) / wall, 1), "ttft_p50_s": round(pct([r["ttft"] for r in ok], 50), 3),
            "ttft_p99_s": round(pct([r["ttft"] for r in ok], 99), 3), "itl_p99_s": round(pct(g, 99), 4),
            "longest_stall_s": round(max(g, default=0.0), 3), "cpu_cores": round((server.cpu_s() - cpu0) / wall, 2),
            "peak_rss_mb": server.peak_rss_mb()}


def per_token_ms(results: list[dict]) -> float:
    return 1000 * median((r["latency"] - r["ttft"]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1)


def json_phase(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    base = {"messages": [{"role": "user", "content": "Describe a character of a play as JSON: name, age, lines."}],
            "max_tokens": args.max_tokens}
    fmt = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    out = {}
    for name, body in (("plain", base), ("json_schema", {**base, **fmt})):
        asyncio.run(run_clients(server.url, [[body]] * 16))  # warm-up (grammar and masks built)
        wait_quiet(timeout_s=args.quiet_timeout, stats=QUIET)
        results, _ = asyncio.run(run_clients(server.url, [[body]] * 16))
        out[f"ms_per_token_{name}"] = round(per_token_ms(results), 2)
    out["overhead"] = round(out["ms_per_token_json_schema"] / out["ms_per_token_plain"] - 1, 3)
    return out


def single_stream(server: Server, body: dict, args: argparse.Namespace, repeats: int = 3) -> dict[str, Any]:
    asyncio.run(run_clients(server.url, [[body]]))  # warm-up
    wait_quiet(timeout_s=args.quiet_timeout, stats=QUIET)
    results, wall = asyncio.run(run_clients(server.url, [[body] * repeats]))
    # decode_tok_s: after the first token (the prompt's prefill, the same work with or without drafts, excluded)
    return {"tok_s": round(sum(r["tokens"] for r in results) / wall, 1),
            "decode_tok_s": round(1000 / per_token_ms(results), 1), "tokens": results[0]["tokens"],
            "text": results[0]["text"]}


def long_prompt_phase(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    text = DATA.joinpath("tinyshakespeare.txt").read_text()[: args.long_tokens * 3]
    long = {"messages": [{"role": "user", "content": "Summarize this scene in one sentence:\n\n" + text}], "max_tokens": 1}
    # long answers, and the prompt sent 1 s in: on a fast machine short answers had ended before it arrived
    streams = [[{"messages": [{"role": "user", "content": "Write a long, detailed essay (at least 600 words) on "
                                                          "this question: " + QUESTIONS[i]}], "max_tokens": 400}]
               for i in range(8)]
    wait_quiet(timeout_s=args.quiet_timeout, stats=QUIET)

    async def scenario() -> tuple[list[dict], dict]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(timeout=900, limits=limits) as http:
            running = [asyncio.create_task(stream_chat(http, server.url, b[0])) for b in streams]
            await asyncio.sleep(1.0)  # the 8 streams are decoding
            big = await stream_chat(http, server.url, long)
            return await asyncio.gather(*running), big

    results, big = asyncio.run(scenario())
    during = gaps(results, big["start"], big["start"] + big["latency"])
    before = gaps(results, 0.0, big["start"])
    return {"long_prompt_ttft_s": round(big["ttft"] or big["latency"], 2), "long_prompt_error": big["error"],
            "itl_p99_before_s": round(pct(before, 99), 4), "itl_p99_during_s": round(pct(during, 99), 4),
            "longest_stall_during_s": round(max(during, default=0.0), 3), "gaps_during": len(during)}


def main() -> None:
    from smollm2_fixture import locate_smollm2

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    ap.add_argument("--gguf", type=Path, default=None, help="default: the SmolLM2-135M-Instruct Q4_1 fixture")
    ap.add_argument("--requests", type=int, default=4, help="requests per client in the load phases")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--long-tokens", type=int, default=7500, help="about how long the long prompt is")
    ap.add_argument("--phases", default="load,json_schema,speculative,long_prompt")
    ap.add_argument("--quiet-timeout", type=float, default=60.0)
    args = ap.parse_args()
    if not args.llama_server.is_file():
        raise SystemExit(f"{args.llama_server} is missing: build llama-server first (benchmarks/RESULTS.md)")
    gguf = args.gguf or locate_smollm2()
    phases = set(args.phases.split(","))
    result: dict[str, Any] = {"benchmark": "serve_llamacpp", "gguf": gguf.name, "max_tokens": args.max_tokens}
    if "load" in phases:
        for c in (1, 8, 32):
            for kind, extra in (("scratchlm", ()), ("llamacpp", ("-np", str(c)))):
                with Server(kind, gguf, args, *extra) as server:
                    result.setdefault("load", {}).setdefault(f"c{c}", {})[kind] = load_phase(server, c, args)
            row = result["load"][f"c{c}"]
            row["tok_s_ratio"] = round(row["scratchlm"]["tok_s"] / max(row["llamacpp"]["tok_s"], 1e-9), 2)
            print(json.dumps({f"c{c}": row}), file=sys.stderr, flush=True)
    if "json_schema" in phases:
        for kind, extra in (("scratchlm", ()), ("llamacpp", ("-np", "16"))):
            with Server(kind, gguf, args, *extra) as server:
                result.setdefault("json_schema", {})[kind] = json_phase(server, args)
        print(json.dumps({"json_schema": result["json_schema"]}), file=sys.stderr, flush=True)
    if "speculative" in phases:
        body = {"messages": [{"role": "user", "content": "Rename the function moving_average to rolling_mean and "
                                                         "return the whole code:\n\n" + CODE}], "max_tokens": 160}
        spec: dict[str, Any] = {}
        for name, kind, extra in (("scratchlm_plain", "scratchlm", ()),
                                  ("scratchlm_ngram", "scratchlm", ("--speculative", "ngram", "--draft-tokens", "6")),
                                  ("llamacpp_plain", "llamacpp", ()),
                                  ("llamacpp_ngram", "llamacpp", ("--spec-type", "ngram-simple"))):
            with Server(kind, gguf, args, *extra) as server:
                spec[name] = single_stream(server, body, args)
        for who in ("scratchlm", "llamacpp"):
            spec[f"{who}_speedup"] = round(spec[f"{who}_ngram"]["decode_tok_s"] / spec[f"{who}_plain"]["decode_tok_s"], 2)
            spec[f"{who}_same_text"] = spec[f"{who}_ngram"]["text"] == spec[f"{who}_plain"]["text"]
        for v in spec.values():
            if isinstance(v, dict):
                v.pop("text")
        result["speculative"] = spec
        print(json.dumps({"speculative": spec}), file=sys.stderr, flush=True)
    if "long_prompt" in phases:
        for name, kind, extra in (("scratchlm_chunked", "scratchlm", ()),
                                  ("scratchlm_unchunked", "scratchlm", ("--prefill-chunk", "65536")),
                                  ("llamacpp", "llamacpp", ("-np", "9", "-c", "16384", "--kv-unified"))):
            with Server(kind, gguf, args, *extra) as server:
                result.setdefault("long_prompt", {})[name] = long_prompt_phase(server, args)
        print(json.dumps({"long_prompt": result["long_prompt"]}), file=sys.stderr, flush=True)
    import torch

    result.update({"torch": torch.__version__, "quiet": QUIET})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
