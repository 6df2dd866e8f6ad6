"""The bridge between one HTTP request (asyncio) and its sequences in the scheduler (a thread).

The scheduler thread calls the sink, which appends the event to the run's inbox; only an append to an
empty inbox wakes the request's event loop (call_soon_threadsafe), so one decode step costs each request
one wake-up however many of its choices produced text. The handler awaits `events()`. Closing the run (client gone, or the
handler finished early) cancels whatever is still generating, which frees those batch rows.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from scratchlm.serve.prompting import JobSpec
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.sequence import Event, Finished, Sequence


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
                index = i * job.n + j
                seed = None if job.seed is None else job.seed + j
                self.sequences.append(Sequence.create(
                    index, prompt, job.max_tokens[i], job.params, self._sink, tokenizer=tokenizer,
                    vocab_size=vocab_size, stop_token_ids=job.stop_token_ids, stop_strings=job.stop_strings, seed=seed,
                    device=scheduler.device,
                ))
        self.texts = [""] * len(self.sequences)
        self.reasons: list[str | None] = [None] * len(self.sequences)
        self.completion_tokens = 0
        self.error: str | None = None

    def _sink(self, event: Event) -> None:
        """Called on the scheduler thread."""
        with self._lock:
            self._inbox.append(event)
            first = len(self._inbox) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the request's event loop is closed: nobody listens; never break the scheduler
                pass

    def start(self) -> None:
        self.scheduler.submit(self.sequences)

    def close(self) -> None:
        """Cancel every sequence that has not finished (no-op for finished ones)."""
        alive = [s for s in self.sequences if not s.done]
        if alive:
            self.scheduler.cancel(alive)

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
                if isinstance(event, Finished):
                    pending -= 1
                    self.reasons[event.index] = event.finish_reason
                    self.completion_tokens += event.completion_tokens
                    self.error = self.error or event.error
                else:
                    self.texts[event.index] += event.text
            yield batch
