"""The scheduler's thread and its queue: what other threads call (submit / cancel / abort), and the loop that
runs `step()` while there is work. The step itself is serve/scheduler.py's.

The waiting queue is bounded (`max_queue` sequences beyond the free batch seats): `submit` raises QueueFull
past it (the server answers 429). `abort(message)` fails every sequence at the next step boundary (graceful
shutdown); an exception inside a step fails the affected sequences and the loop goes on.

Waking a request's event loop is deferred (`wake`): an event loop woken in the middle of a step's Python
work asks for the GIL the scheduler holds, and the scheduler then waits ~0.5 ms (the switch interval) per
token for it back. The scheduler hands the wake-ups over (`flush_wakes`) right before it runs the model
(the kernels and torch ops release the GIL, so the loop streams while the step computes) and whenever it
goes idle.
"""

from __future__ import annotations

import logging
import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from scratchlm.serve.omp_team import release_openmp_team
from scratchlm.serve.sequence import Sequence

log = logging.getLogger("scratchlm.serve")


class QueueFull(Exception):
    """The waiting queue holds max_queue sequences already."""


@dataclass
class SchedulerStats:
    """Counters for /health, /metrics and tests: how much batching really happened."""

    waiting: int = 0
    active: int = 0
    prefilling: int = 0  # sequences whose prompt is being prefilled (chunked)
    steps: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    rejected: int = 0  # sequences refused because the queue was full
    preempted: int = 0  # rows that gave their blocks back and waited again
    max_active: int = 0
    decoded_tokens: int = 0  # tokens chosen, from prefill logits and from decode steps
    decode_rows: int = 0  # sum over decode steps of the rows in the step (mean batch = decode_rows / steps)
    prompt_tokens: int = 0  # prompt tokens admitted
    cached_prompt_tokens: int = 0  # of which K/V came from the prefix cache
    kv_blocks_used: int = 0  # pool blocks in use (running rows, prefills, prefix cache)
    kv_blocks_total: int = 0
    kv_blocks_high_water: int = 0
    decode_window_bytes: int = 0  # the fast step's contiguous copy of the running rows' K/V


class SchedulerThread:
    """Thread plumbing for a scheduler: subclasses define step(), busy(), seats_taken, max_batch, _fail_all()."""

    max_batch: int

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.stats = SchedulerStats()
        self.recent: deque[tuple[float, int]] = deque()  # (time, tokens chosen) of the last steps, for tokens/s
        self._cond = threading.Condition()
        self._running = False
        self._abort: str | None = None
        self._thread: threading.Thread | None = None
        self._wakes: list[tuple[asyncio.AbstractEventLoop, Callable[[], object]]] = []  # scheduler thread only

    # ---- called from other threads -------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._running:
                return
            self._running = True
        # the caller (the event loop's thread, which loaded the model) hands back its OpenMP workers: with two
        # pools on the machine's cores libgomp stops spinning and every parallel region of a step sleeps/wakes
        release_openmp_team()
        self._thread = threading.Thread(target=self._loop, name="scratchlm-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, sequences: list[Sequence]) -> None:
        """Queue sequences; they join the running batch at the next step. QueueFull when the waiting
        queue would exceed max_queue (a request's choices are taken all or none)."""
        with self._cond:
            free = self.max_batch - self.seats_taken
            if len(self.waiting) + len(sequences) > self.max_queue + max(free, 0):
                self.stats.rejected += len(sequences)
                raise QueueFull(f"{len(self.waiting)} sequences are waiting (limit {self.max_queue})")
            self.waiting.extend(sequences)
            self.stats.waiting = len(self.waiting)
            self._cond.notify_all()

    def cancel(self, sequences: list[Sequence]) -> None:
        """Mark sequences cancelled; their rows are freed before the next step."""
        with self._cond:
            for s in sequences:
                s.cancelled = True
            self._cond.notify_all()

    def abort(self, message: str) -> None:
        """Fail every running and waiting sequence (with `message`) at the next step boundary."""
        with self._cond:
            self._abort = message
            self._cond.notify_all()

    def tokens_per_second(self, window: float = 10.0) -> float:
        """Tokens chosen per second over the last `window` seconds."""
        now = time.monotonic()
        with self._cond:
            recent = [n for t, n in self.recent if t >= now - window]
        return sum(recent) / window

    def wake(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
        """Run callback on loop: at the scheduler's next flush when called on the scheduler thread, else now."""
        if threading.current_thread() is self._thread:
            self._wakes.append((loop, callback))
        else:
            _call_soon(loop, callback)

    # ---- the scheduler thread -------------------------------------------------------------------
    def flush_wakes(self) -> None:
        """Hand the deferred wake-ups to their event loops (before the model runs, and when going idle)."""
        wakes, self._wakes = self._wakes, []
        for loop, callback in wakes:
            _call_soon(loop, callback)

    def _loop(self) -> None:
        while True:
            if not self.busy():  # going idle: no model call will hand the wake-ups over
                self.flush_wakes()
            with self._cond:
                while self._running and not self.busy() and self._abort is None:
                    self._cond.wait()
                if not self._running:
                    break
                message, self._abort = self._abort, None
            if message is not None:
                self._fail_all(message)
                continue
            try:
                self.step()
            except Exception as exc:  # a bug must not kill the server: fail the affected sequences
                log.exception("scheduler step failed; failing the running and waiting sequences")
                self._fail_all(f"internal error in the scheduler ({type(exc).__name__}); see the server log")



def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the request's event loop is closed: nobody listens; never break the scheduler
        pass
