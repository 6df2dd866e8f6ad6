"""The scheduler hands event-loop wake-ups over right before the model runs (serve/scheduler_thread.py), and the
thread that starts it gives back its OpenMP workers (serve/omp_team.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import torch

from scratchlm.config import get_preset
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.sequence import Finished, Sequence
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer


class RecordingLoop:
    """Stands in for an asyncio loop: call_soon_threadsafe runs the callback at once and logs it."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def call_soon_threadsafe(self, callback) -> None:
        self.log.append("wake")
        callback()


def test_wakes_wait_for_the_model_and_none_is_lost():
    torch.manual_seed(0)
    model = TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=2, max_seq_len=64)).eval()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    sched = Scheduler(model, max_batch=2, decode="fast")
    log: list[str] = []
    loop = RecordingLoop(log)
    done = threading.Event()
    woken: list[str] = []

    def sink(event) -> None:  # as RequestRun._sink: record, then ask for a wake-up (on the scheduler thread)
        log.append("event")
        sched.wake(loop, lambda: woken.append("x"))
        if isinstance(event, Finished):
            done.set()

    inner = sched.rows_impl.step

    def step(*args):
        log.append("model")
        return inner(*args)

    sched.rows_impl.step = step
    sched.start()
    try:
        sched.submit([Sequence.create(0, [5, 6, 7], 12, SamplingParams(), sink, tokenizer=tok, vocab_size=259)])
        assert done.wait(60)
        deadline = time.monotonic() + 10
        while len(woken) < log.count("event") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sched.stop()
    assert log.count("model") == 11 and log.count("event") >= 12  # 12 tokens: 1 from the prefill, 11 steps
    assert len(woken) == log.count("event") == log.count("wake")  # every wake-up delivered
    # a wake-up never goes out between a token's event and the next model call: only right before the model
    # runs (after its "model" mark) or when the scheduler goes idle at the end
    last_model = max(i for i, e in enumerate(log) if e == "model")
    for i, e in enumerate(log[:last_model]):
        if e == "wake":
            before = [x for x in log[:i] if x != "wake"]
            assert before[-1] == "model", log


def test_a_wake_from_another_thread_is_not_deferred():
    model = TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=1, max_seq_len=16)).eval()
    sched = Scheduler(model, max_batch=1, decode="model")
    log: list[str] = []
    sched.wake(RecordingLoop(log), lambda: log.append("ran"))
    assert log == ["wake", "ran"]


def test_release_openmp_team_frees_the_calling_threads_workers():
    """A thread that ran a 2-thread parallel region keeps an OpenMP worker; after release it has exited."""
    code = textwrap.dedent("""
        import os, torch
        from scratchlm.serve.omp_team import release_openmp_team
        torch.set_num_threads(2)
        tasks = lambda: len(os.listdir("/proc/self/task"))
        before = tasks()
        a = torch.randn(4_000_000)
        (a * 2).exp_()  # parallel over 2 threads: this thread's team gets a worker
        with_team = tasks()
        released = release_openmp_team()
        print(before, with_team, tasks(), released)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, with_team, after, released = map(int, out.stdout.split())
    assert with_team == before + 1 and after == before and released >= 1
