"""One generation job inside the scheduler: its prompt, sampler state, stop rules and output events.

Text is streamed as whole characters; the end of the text that may begin a stop string is held
back until it is known not to be one (StopChecker.stable_len), so a stop string never leaks out.
A token's logprob entry travels with the text delta that first shows its text (entries of tokens cut
by a stop string, and of stop tokens, are dropped with their text). Events go to `sink` (called
from the scheduler thread):
    TextDelta(index, text, logprobs)                         new text of choice `index`
    Finished(index, finish_reason, tokens, error, cached)    "stop" | "length" | "cancelled" | "error"
With `echo`, the first delta is the prompt's own text (and its per-token logprobs, the first None).
With a `constraint` (structured output, see generate/constrained) the choice ends with "stop" as soon
as the constraint is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from scratchlm.generate.detokenize import IncrementalDetokenizer
from scratchlm.generate.sampling import SamplingParams, make_generator
from scratchlm.generate.stopping import StopChecker


@dataclass(frozen=True)
class TokenLogprob:
    """log p(token | text before it) under the model, the `top` most likely (id, logprob), and the
    character offset of the token's text in the choice's text. logprob None: the first prompt token."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()
    offset: int = 0


@dataclass(frozen=True)
class TextDelta:
    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    index: int
    finish_reason: str
    completion_tokens: int
    error: str | None = None
    cached_tokens: int = 0


Event = TextDelta | Finished
Sink = Callable[[Event], None]
LogprobInfo = tuple[float, tuple[tuple[int, float], ...]]  # (logprob of the token, top alternatives)


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
    top_logprobs: int | None = None  # None: no logprobs; k: the token's logprob and the k most likely
    echo: bool = False
    constraint: Any = None  # generate.constrained.TokenConstraint or None
    tokens: list[int] = field(default_factory=list)
    emitted: int = 0  # characters already sent
    echo_len: int = 0  # characters of echoed prompt before the completion's text
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    pending: list[TokenLogprob] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    kv: Any = None  # its BlockTable (nn/paged_kv_cache.py) while it holds K/V in the scheduler's pool
    admitted: int = -1  # admission order (the newest running row is the first to give way when blocks run out)
    started: bool = False  # start() ran (a preempted sequence comes back without a second start)
    draft_kv: Any = None  # speculative decoding with a draft model: its BlockTable in the draft's pool
    draft_fed: list[int] = field(default_factory=list)  # the tokens whose draft K/V that table holds
    draft_len: int | None = None  # speculative decoding: this row's next draft length (None: Speculation.k)

    @classmethod
    def create(
        cls, index: int, prompt: list[int], max_tokens: int, params: SamplingParams, sink: Sink, *,
        tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...] = (), stop_strings: tuple[str, ...] = (),
        seed: int | None = None, device: torch.device | str = "cpu", top_logprobs: int | None = None,
        echo: bool = False, constraint: Any = None,
    ) -> "Sequence":
        """A fresh sequence; the seeded generator makes its draws reproducible. `device`: the model's."""
        stopper = StopChecker(1, stop_token_ids, stop_strings, tokenizer, track_text=True)
        # OpenAI penalties count the tokens sampled so far (not the prompt), as vLLM does
        counts = torch.zeros(1, vocab_size, dtype=torch.int32, device=device) if params.uses_counts else None
        return cls(index, list(prompt), max_tokens, params, stopper, sink, make_generator(seed, device), counts,
                   top_logprobs, echo, constraint)

    @property
    def last_position(self) -> int:
        """Position of the newest token (the one the next decode step feeds)."""
        return len(self.prompt) + len(self.tokens) - 1

    @property
    def needs_prompt_logprobs(self) -> bool:
        return self.echo and self.top_logprobs is not None

    def start(self, prompt_logprobs: list[LogprobInfo | None] | None = None) -> None:
        """Called once the prompt is prefilled: echo the prompt (with its logprobs), or finish at once
        when no token is wanted (max_tokens 0: scoring the prompt)."""
        self.started = True
        if self.echo:
            dec = IncrementalDetokenizer(self.stopper.decoders[0].tokenizer)
            entries = []
            for i, token in enumerate(self.prompt):
                offset = len(dec.text)
                dec.push(token)
                if prompt_logprobs is not None:
                    info = prompt_logprobs[i]
                    lp, top = (None, ()) if info is None else info
                    entries.append(TokenLogprob(token, lp, top[: self.top_logprobs], offset))
            dec.flush()
            self.echo_len = len(dec.text)
            if dec.text or entries:
                self.sink(TextDelta(self.index, dec.text, tuple(entries)))
        if self.max_tokens == 0:
            self._finish("length")

    def push(self, token: int, logprob: LogprobInfo | None = None) -> None:
        """Record the next token, emit the text that became safe to show, finish when a rule says so."""
        offset = self.echo_len + len(self.stopper.text(0))
        self.tokens.append(token)
        if self.counts is not None:
            self.counts[0, token] += 1
        self.stopper.push(0, token)
        is_stop = self.stopper.done[0] and token in self.stopper.stop_ids
        if logprob is not None and not is_stop:
            self.pending.append(TokenLogprob(token, logprob[0], logprob[1], offset))
        complete = False
        if self.constraint is not None and not is_stop:
            self.constraint.advance(token)
            complete = self.constraint.complete
        if self.stopper.done[0] or complete or len(self.tokens) >= self.max_tokens:
            if complete and not self.stopper.done[0]:
                self.stopper.done[0], self.stopper.reasons[0] = True, "stop"
            self.stopper.finish(0)
            self._emit(len(self.stopper.text(0)))
            self._finish(self.stopper.reasons[0] or "length")
        else:
            self._emit(self.stopper.stable_len(0))

    def _emit(self, upto: int) -> None:
        text = self.stopper.text(0)[self.emitted : upto]
        limit = self.echo_len + upto
        ready = [e for e in self.pending if e.offset < limit]
        if text or ready:
            self.emitted = max(self.emitted, upto)
            self.pending = self.pending[len(ready):]
            self.sink(TextDelta(self.index, text, tuple(ready)))

    def _finish(self, reason: str, error: str | None = None) -> None:
        if not self.done:
            self.done = True
            self.pending = []
            self.sink(Finished(self.index, reason, len(self.tokens), error, self.cached_tokens))

    def cancel(self) -> None:
        """Stop without further events except Finished("cancelled")."""
        self._finish("cancelled")

    def fail(self, message: str) -> None:
        self._finish("error", message)
