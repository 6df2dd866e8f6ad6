"""Load: 32 concurrent streaming clients x 3 requests, bounded in time. Zero errors, every stream
complete ([DONE] + finish_reason), every text equal to the engine's reply to that prompt alone, and
the scheduler really batched them (on average >= 4 sequences per decode step)."""

from __future__ import annotations

import asyncio

from scratchlm.serve.loadgen import percentile, run_load

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
    after = server.health()
    rows, steps = after["decode_rows"] - before["decode_rows"], after["steps"] - before["steps"]
    assert rows / steps >= 4  # on average >= 4 sequences shared a decode step
    assert after["completed"] - before["completed"] == CLIENTS * PER_CLIENT
    assert after["active"] == 0 and after["waiting"] == 0


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) == 0.0
