"""Load: 32 concurrent streaming clients x 3 requests, bounded in time. Zero errors, every stream
complete ([DONE] + finish_reason), every text equal to the engine's reply to that prompt alone. That rows
really share decode steps is tested deterministically in test_scheduler.py; the mean batch under load is a
timing figure, reported by benchmarks/serve_load.py."""

from __future__ import annotations

import asyncio

from loadgen import percentile, run_load
from tiny_checkpoint import API_KEY, MODEL
from serve_helpers import ref_completion

PROMPTS = ["First Citizen:\n", "ROMEO:", "To be, or not", "KING HENRY", "O, what a rogue", "Now is the winter"]
CLIENTS, PER_CLIENT, MAX_TOKENS = 32, 3, 12


def test_32_concurrent_streaming_clients(server, reference):
    before = server.health()
    report = asyncio.run(run_load(server.api, MODEL, PROMPTS, CLIENTS, PER_CLIENT, MAX_TOKENS, API_KEY,
                                  timeout_s=240))
    summary = report.summary()
    assert summary["requests"] == CLIENTS * PER_CLIENT
    assert summary["errors"] == 0, [r.error for r in report.results if not r.ok][:3]
    assert all(r.done and r.finish_reason in ("stop", "length") for r in report.results)
    expected = {p: ref_completion(reference, p, MAX_TOKENS) for p in PROMPTS}
    assert all(r.text == expected[r.prompt] for r in report.results)
    after = server.health()  # how much batching happened is a timing figure: benchmarks/serve_load.py reports it
    assert after["completed"] - before["completed"] == CLIENTS * PER_CLIENT
    assert after["active"] == 0 and after["waiting"] == 0


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) == 0.0


def test_mixed_concurrent_requests_match_engine(server, reference):
    """16 concurrent official-client requests with different sampling settings, streamed and not, share
    the batch; each reply must equal the engine's reply to that request alone (same seed)."""
    from serve_helpers import async_client

    jobs = [(PROMPTS[i % len(PROMPTS)], 6 + i % 7, {"temperature": 0.7 + 0.05 * (i % 5), "top_p": 0.9, "seed": i})
            for i in range(16)]

    async def one(c, i, prompt, max_tokens, kw):
        if i % 2:
            stream = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True, **kw)
            return "".join([ch.choices[0].text async for ch in stream if ch.choices])
        out = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **kw)
        return out.choices[0].text

    async def all_jobs():
        c = async_client(server)
        return await asyncio.wait_for(asyncio.gather(*(one(c, i, *job) for i, job in enumerate(jobs))), 120)

    texts = asyncio.run(all_jobs())
    assert texts == [ref_completion(reference, p, m, **kw) for p, m, kw in jobs]
