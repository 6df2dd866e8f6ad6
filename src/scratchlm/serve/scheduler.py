"""Step-level continuous batching: sequences join and leave the running batch between decode steps.

The generation engine (scratchlm.generate.engine) runs a fixed batch from prefill to the end; a
server needs rows to come and go. This scheduler builds that step loop on the same pieces: the model
+ KV cache forward (`forward_last`), the left-padding prefill (`left_pad`) and the samplers
(`choose_next_token`). One background thread repeats:

    1. drop cancelled rows (a client went away) and admit waiting sequences into free rows:
       prefill them (serve/joining.py: together, or from the prefix cache), copy their K/V into the
       SlotCache, choose token 1
    2. one decode step for all n active rows: logits (n, V) = model(last tokens (n, 1),
       positions (n, 1), key mask (n, c + 1), cache view);  each row chooses with its own params,
       constraint and logprobs (serve/token_choice.py)
    3. finished rows leave (their row is reused at the next step; their K/V go to the prefix cache)

The decode step is `make_decode_step(model, decode)`: "model" (the model's forward) or "fast" /
"fast-int8" (generate.fast_decode.FastDecoder on the same slot cache). Prefill runs generate's prefill
(generate/prefill.py) in the `prefill` mode: "model", or "bf16" through a bf16 copy of the model.
The waiting queue is bounded (`max_queue` sequences): `submit` raises QueueFull beyond it.
`abort(message)` fails every sequence at the next step boundary (graceful shutdown).
Everything here runs on the scheduler thread; other threads call submit() / cancel() / abort() only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from scratchlm.generate.decode_step import DECODE_MODES, make_decode_step
from scratchlm.generate.prefill import PREFILL_MODES
from scratchlm.model import TransformerLM
from scratchlm.serve.joining import prefill_prompts
from scratchlm.serve.prefix_cache import PrefixCache
from scratchlm.serve.sequence import Sequence
from scratchlm.serve.slot_cache import SlotCache
from scratchlm.serve.token_choice import choose_tokens

SERVE_DECODE_MODES = tuple(m for m in DECODE_MODES if m != "compiled")  # compiled: recompiles per batch size
log = logging.getLogger("scratchlm.serve")


class QueueFull(Exception):
    """The waiting queue holds max_queue sequences already."""


@dataclass
class SchedulerStats:
    """Counters for /health, /metrics and tests: how much batching really happened."""

    waiting: int = 0
    active: int = 0
    steps: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    rejected: int = 0  # sequences refused because the queue was full
    max_active: int = 0
    decoded_tokens: int = 0  # tokens chosen, from prefill logits and from decode steps
    decode_rows: int = 0  # sum over decode steps of the rows in the step (mean batch = decode_rows / steps)
    prompt_tokens: int = 0  # prompt tokens admitted
    cached_prompt_tokens: int = 0  # of which K/V came from the prefix cache


class Scheduler:
    """Runs every submitted Sequence to completion in a shared, changing batch."""

    def __init__(self, model: TransformerLM, max_batch: int = 32, pad_id: int = 0, decode: str = "model",
                 max_queue: int = 256, prefix_cache: PrefixCache | None = None, context: int | None = None,
                 prefill: str = "model") -> None:
        if decode not in SERVE_DECODE_MODES:
            raise ValueError(f"unknown decode mode {decode!r} for serving; valid: {SERVE_DECODE_MODES}")
        if prefill not in PREFILL_MODES:
            raise ValueError(f"unknown prefill mode {prefill!r}; valid: {PREFILL_MODES}")
        self.prefill = prefill
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0 (0 = no waiting: busy means 429)")
        self.model = model.eval()
        self.decode_step = make_decode_step(self.model, decode)
        self.slots = SlotCache(model, max_batch, context)  # context: tokens per row (default max_seq_len)
        self.device = self.slots.cache.k.device
        self.pad_id, self.max_queue = pad_id, max_queue
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(capacity_bytes=0)
        self.rows: list[Sequence] = []  # rows[i] is the sequence in cache row i
        self.joining: list[Sequence] = []  # taken from `waiting`, being prefilled this step
        self.waiting: deque[Sequence] = deque()
        self.stats = SchedulerStats()
        self.recent: deque[tuple[float, int]] = deque()  # (time, tokens chosen) of the last steps, for tokens/s
        self._cond = threading.Condition()
        self._running = False
        self._abort: str | None = None
        self._thread: threading.Thread | None = None

    # ---- called from other threads -------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._running:
                return
            self._running = True
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
            free = self.slots.free_rows - len(self.joining)
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

    # ---- the scheduler thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._running and not self.waiting and not self.rows and self._abort is None:
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

    def _take_waiting(self) -> list[Sequence]:
        with self._cond:
            for s in [s for s in self.waiting if s.cancelled]:
                self.waiting.remove(s)
                self._retire(s)
            take = [self.waiting.popleft() for _ in range(min(self.slots.free_rows, len(self.waiting)))]
            self.stats.waiting = len(self.waiting)
            self.joining = take  # kept on self so that _fail_all reaches them too
        return take

    @torch.inference_mode()
    def step(self) -> None:
        """Admit, decode one token for every active row, retire finished rows."""
        for row in reversed(range(len(self.rows))):
            if self.rows[row].cancelled:
                self._remove_row(row)
        joining = self._take_waiting()
        if joining:
            self._admit(joining)
        self.joining = []
        if self.rows:
            self._decode()
        self.stats.active = len(self.rows)

    def _admit(self, joining: list[Sequence]) -> None:
        """Prefill the joiners' distinct prompts (the n choices of a prompt share one prefill), move them
        into the slot cache, choose token 1 of every joiner."""
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(s.prompt), len(distinct)) for s in joining]  # joiner -> prompt
        scored: dict[int, int] = {}  # prompt -> the most alternatives any of its echo + logprobs joiners wants
        for s, src in zip(joining, source):
            if s.needs_prompt_logprobs:
                scored[src] = max(scored.get(src, 0), s.top_logprobs)
        done = prefill_prompts(self.model, list(distinct), scored, self.prefix_cache, self.pad_id, self.device,
                               self.prefill)
        for s, src in zip(joining, source):
            s.cached_tokens = done[src].cached
            self.stats.prompt_tokens += len(s.prompt)
            self.stats.cached_prompt_tokens += done[src].cached
            s.start(done[src].prompt_logprobs)
        entering = [(s, src) for s, src in zip(joining, source) if not s.done]
        for s in joining:
            if s.done:  # max_tokens 0: the prompt was all it wanted
                self._retire(s)
        if not entering:
            return
        self.slots.ensure_left_room(max(done[src].width for _, src in entering))
        for s, src in entering:
            self.slots.insert(done[src].cache, done[src].valid[None], [done[src].row])
            self.rows.append(s)
        self.stats.max_active = max(self.stats.max_active, len(self.rows))
        logits = torch.stack([done[src].logits for _, src in entering])  # (J, V)
        self._choose_and_push(logits, first_row=len(self.rows) - len(entering))

    def _decode(self) -> None:
        view, key_mask = self.slots.step_view()  # cache rows[:n], mask (n, c + 1)
        tokens = torch.tensor([[s.tokens[-1]] for s in self.rows], dtype=torch.long, device=key_mask.device)
        positions = torch.tensor([[s.last_position] for s in self.rows], dtype=torch.long, device=key_mask.device)
        logits = self.decode_step(tokens, positions, key_mask, view)  # (n, V)
        self.slots.finish_step(view)
        self.stats.steps += 1
        self.stats.decode_rows += len(self.rows)
        self._choose_and_push(logits, first_row=0)

    def _choose_and_push(self, logits: torch.Tensor, first_row: int) -> None:
        """logits (k, V) belong to rows first_row .. first_row+k-1: choose, push, retire finished."""
        seqs = self.rows[first_row : first_row + logits.shape[0]]
        for s, (token, info) in zip(seqs, choose_tokens(logits, seqs)):
            s.push(token, info)
        self.stats.decoded_tokens += len(seqs)
        now = time.monotonic()
        with self._cond:
            self.recent.append((now, len(seqs)))
            while self.recent and self.recent[0][0] < now - 60:
                self.recent.popleft()
        for row in reversed(range(first_row, first_row + len(seqs))):
            if self.rows[row].done:
                self._remove_row(row)

    def _remove_row(self, row: int) -> None:
        seq = self.rows[row]
        self._store_prefix(row, seq)
        moved = self.slots.remove(row)
        if moved is not None:
            self.rows[row] = self.rows[moved]
        self.rows.pop()
        self._retire(seq)

    def _store_prefix(self, row: int, seq: Sequence) -> None:
        """Offer the row's K/V (prompt + generated tokens but the last, which was never fed) to the prefix cache."""
        if not self.prefix_cache.enabled:
            return
        ids = seq.prompt + seq.tokens[:-1]
        slots = self.slots.valid[row].nonzero()[:, 0]  # the row's slots, contiguous
        if slots.numel() != len(ids) or int(slots[-1] - slots[0]) + 1 != len(ids):
            return
        first = int(slots[0])
        k, v = self.slots.cache.k, self.slots.cache.v
        self.prefix_cache.store(ids, lambda a, b: (k[:, row, :, first + a : first + b], v[:, row, :, first + a : first + b]))

    def _retire(self, seq: Sequence) -> None:
        if seq.cancelled and not seq.done:
            seq.cancel()
            self.stats.cancelled += 1
        elif seq.done:
            self.stats.completed += 1

    def _fail_all(self, message: str) -> None:
        """Fail every running and waiting sequence and start clean (internal error, or shutdown)."""
        with self._cond:
            victims = self.rows + [s for s in self.joining if s not in self.rows] + list(self.waiting)
            self.waiting.clear()
            self.joining = []
            self.stats.waiting = 0
        victims = [s for s in victims if not s.done]
        for s in victims:
            s.fail(message)
        self.stats.errors += len(victims)
        self.rows = []
        while self.slots.rows:
            self.slots.remove(self.slots.rows - 1)
        self.stats.active = 0
