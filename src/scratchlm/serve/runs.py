"""The bridge between one HTTP request (asyncio) and its sequences in the scheduler (a thread).

The scheduler thread calls the sink, which appends the event to the run's inbox; only an append to an
empty inbox wakes the request's event loop (call_soon_threadsafe, handed over by the scheduler right before
it runs the model), so one decode step costs each request one wake-up however many of its choices produced text. The handler awaits `events()`. Closing the run
(client gone, or the handler finished early) cancels whatever is still generating, which frees those
batch rows. A full scheduler queue is a 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from scratchlm.serve.prompting import JobSpec
from scratchlm.serve.protocol import APIError
from scratchlm.serve.responses import ChoiceResult
from scratchlm.serve.scheduler import QueueFull, Scheduler
from scratchlm.serve.sequence import Event, Finished, Sequence

RETRY_AFTER_S = 1


class RequestRun:
    """All choices of one request: submitted together, events merged in arrival order."""

    def __init__(self, scheduler: Scheduler, job: JobSpec, tokenizer: Any, vocab_size: int) -> None:
        self.scheduler = scheduler
        self.loop = asyncio.get_running_loop()
        self._inbox: list[Event] = []
        self._lock = threading.Lock()
        self._wake = asyncio.Event()
        self.sequences: list[Sequence] = []
        for i, prompt in enumerate(job.prompts):
            for j in range(job.n):
                seed = None if job.seed is None else job.seed + j
                self.sequences.append(Sequence.create(
                    i * job.n + j, prompt, job.max_tokens[i], job.params, self._sink, tokenizer=tokenizer,
                    vocab_size=vocab_size, stop_token_ids=job.stop_token_ids, stop_strings=job.stop_strings, seed=seed,
                    device=scheduler.device, top_logprobs=job.top_logprobs, echo=job.echo,
                    constraint=None if job.constraint is None else job.constraint(),
                ))
        self.results = [ChoiceResult() for _ in self.sequences]
        self.n = job.n
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.error: str | None = None
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    def _sink(self, event: Event) -> None:
        """Called on the scheduler thread."""
        with self._lock:
            self._inbox.append(event)
            first = len(self._inbox) == 1
        if first:  # deferred by the scheduler to its next GIL-free moment (serve/scheduler_thread.py)
            self.scheduler.wake(self.loop, self._wake.set)

    def start(self) -> None:
        try:
            self.scheduler.submit(self.sequences)
        except QueueFull:
            raise APIError(429, f"the server is busy ({self.scheduler.max_queue} requests already wait); retry in "
                           f"{RETRY_AFTER_S} s", "server_busy", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None

    def close(self) -> None:
        """Cancel every sequence that has not finished (no-op for finished ones)."""
        alive = [s for s in self.sequences if not s.done]
        if alive:
            self.scheduler.cancel(alive)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def latency(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started

    async def events(self) -> AsyncIterator[list[Event]]:
        """Yield the events that have arrived (all of them, at least one) until every choice has finished;
        texts / reasons / token counts are recorded on the way. Taking what piled up at once keeps a
        busy stream to one network write per wake-up instead of one per token."""
        pending = len(self.sequences)
        while pending:
            await self._wake.wait()
            with self._lock:
                batch, self._inbox = self._inbox, []
                self._wake.clear()
            if not batch:
                continue
            for event in batch:
                res = self.results[event.index]
                if isinstance(event, Finished):
                    pending -= 1
                    res.finish_reason = event.finish_reason
                    self.completion_tokens += event.completion_tokens
                    if event.index % self.n == 0:  # once per prompt, not per choice
                        self.cached_tokens += event.cached_tokens
                    self.error = self.error or event.error
                else:
                    if self.first_token_at is None and event.text:
                        self.first_token_at = time.monotonic()
                    res.text += event.text
                    res.logprobs.extend(event.logprobs)
            yield batch
        self.finished_at = time.monotonic()
