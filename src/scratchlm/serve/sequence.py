"""One generation job inside the scheduler: its prompt, sampler state, stop rules and output events.

Text is streamed as whole characters; the end of the text that may begin a stop string is held
back until it is known not to be one (StopChecker.stable_len), so a stop string never leaks out.
Events go to `sink` (called from the scheduler thread):
    TextDelta(index, text)                     new text of choice `index`
    Finished(index, finish_reason, tokens)     "stop" | "length" | "cancelled" | "error", token count
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from scratchlm.generate.sampling import SamplingParams, make_generator
from scratchlm.generate.stopping import StopChecker


@dataclass(frozen=True)
class TextDelta:
    index: int
    text: str


@dataclass(frozen=True)
class Finished:
    index: int
    finish_reason: str
    completion_tokens: int
    error: str | None = None


Event = TextDelta | Finished
Sink = Callable[[Event], None]


@dataclass(eq=False)  # identity equality: two jobs with equal fields are still different jobs
class Sequence:
    """State of one choice being generated: prompt (P,), tokens generated so far, stop state."""

    index: int
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stopper: StopChecker
    sink: Sink
    generator: torch.Generator | None = None
    counts: torch.Tensor | None = None  # (1, V) counts of generated tokens, for the penalties
    tokens: list[int] = field(default_factory=list)
    emitted: int = 0  # characters already sent
    cancelled: bool = False
    done: bool = False

    @classmethod
    def create(
        cls, index: int, prompt: list[int], max_tokens: int, params: SamplingParams, sink: Sink, *,
        tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...] = (), stop_strings: tuple[str, ...] = (),
        seed: int | None = None, device: torch.device | str = "cpu",
    ) -> "Sequence":
        """A fresh sequence; the seeded generator makes its draws reproducible. `device`: the model's."""
        stopper = StopChecker(1, stop_token_ids, stop_strings, tokenizer, track_text=True)
        # OpenAI penalties count the tokens sampled so far (not the prompt), as vLLM does
        counts = torch.zeros(1, vocab_size, dtype=torch.int32, device=device) if params.uses_counts else None
        return cls(index, list(prompt), max_tokens, params, stopper, sink, make_generator(seed, device), counts)

    @property
    def last_position(self) -> int:
        """Position of the newest token (the one the next decode step feeds)."""
        return len(self.prompt) + len(self.tokens) - 1

    def push(self, token: int) -> None:
        """Record the next token, emit the text that became safe to show, finish when a rule says so."""
        self.tokens.append(token)
        if self.counts is not None:
            self.counts[0, token] += 1
        self.stopper.push(0, token)
        if self.stopper.done[0] or len(self.tokens) >= self.max_tokens:
            self.stopper.finish(0)
            self._emit(len(self.stopper.text(0)))
            self._finish(self.stopper.reasons[0] or "length")
        else:
            self._emit(self.stopper.stable_len(0))

    def _emit(self, upto: int) -> None:
        text = self.stopper.text(0)[self.emitted : upto]
        if text:
            self.emitted = upto
            self.sink(TextDelta(self.index, text))

    def _finish(self, reason: str, error: str | None = None) -> None:
        if not self.done:
            self.done = True
            self.sink(Finished(self.index, reason, len(self.tokens), error))

    def cancel(self) -> None:
        """Stop without further events except Finished("cancelled")."""
        self._finish("cancelled")

    def fail(self, message: str) -> None:
        self._finish("error", message)
