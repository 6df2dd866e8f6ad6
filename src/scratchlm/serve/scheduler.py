"""Step-level continuous batching: sequences join and leave the running batch between decode steps.

The generation engine (scratchlm.generate.engine) runs a fixed batch from prefill to the end; a
server needs rows to come and go. This scheduler builds that step loop on the same pieces: the model
+ KV cache forward (`forward_last`), the left-padding prefill (`left_pad`) and the samplers
(`choose_next_token`). One background thread repeats:

    1. drop cancelled rows (a client went away) and admit waiting sequences into free rows:
       prefill them together (left padded), copy their K/V into the SlotCache, sample token 1
    2. one decode step for all n active rows: logits (n, V) = model(last tokens (n, 1),
       positions (n, 1), key mask (n, c + 1), cache view);  each row samples with its own params
    3. finished rows leave (their row is reused at the next step)

The decode step is `make_decode_step(model, decode)`: "model" (the model's forward) or "fast" /
"fast-int8" (generate.fast_decode.FastDecoder on the same slot cache). Prefill always runs the model.
Greedy rows without penalties share one argmax; other rows sample with their own seeded generator.
Everything here runs on the scheduler thread; other threads call submit() / cancel() only.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import torch

from scratchlm.generate.batching import left_pad
from scratchlm.generate.decode_step import forward_last, make_decode_step
from scratchlm.generate.sampling import choose_next_token
from scratchlm.model import TransformerLM
from scratchlm.serve.sequence import Sequence
from scratchlm.serve.slot_cache import SlotCache

SERVE_DECODE_MODES = ("model", "fast", "fast-int8")  # "compiled" would recompile as the batch changes


@dataclass
class SchedulerStats:
    """Counters for /health and tests: how much batching really happened."""

    waiting: int = 0
    active: int = 0
    steps: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    max_active: int = 0
    decoded_tokens: int = 0  # tokens chosen, from prefill logits and from decode steps
    decode_rows: int = 0  # sum over decode steps of the rows in the step (mean batch = decode_rows / steps)


class Scheduler:
    """Runs every submitted Sequence to completion in a shared, changing batch."""

    def __init__(self, model: TransformerLM, max_batch: int = 32, pad_id: int = 0, decode: str = "model") -> None:
        if decode not in SERVE_DECODE_MODES:
            raise ValueError(f"unknown decode mode {decode!r} for serving; valid: {SERVE_DECODE_MODES}")
        self.model = model.eval()
        self.decode_step = make_decode_step(self.model, decode)
        self.slots = SlotCache(model, max_batch)
        self.device = self.slots.cache.k.device
        self.pad_id = pad_id
        self.rows: list[Sequence] = []  # rows[i] is the sequence in cache row i
        self.joining: list[Sequence] = []  # taken from `waiting`, being prefilled this step
        self.waiting: deque[Sequence] = deque()
        self.stats = SchedulerStats()
        self._cond = threading.Condition()
        self._running = False
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
        """Queue sequences; they join the running batch at the next step."""
        with self._cond:
            self.waiting.extend(sequences)
            self.stats.waiting = len(self.waiting)
            self._cond.notify_all()

    def cancel(self, sequences: list[Sequence]) -> None:
        """Mark sequences cancelled; their rows are freed before the next step."""
        with self._cond:
            for s in sequences:
                s.cancelled = True
            self._cond.notify_all()

    # ---- the scheduler thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._running and not self.waiting and not self.rows:
                    self._cond.wait()
                if not self._running:
                    break
            try:
                self.step()
            except Exception as exc:  # a bug must not kill the server: fail the affected sequences
                self._fail_all(f"{type(exc).__name__}: {exc}")

    def _take_waiting(self) -> list[Sequence]:
        with self._cond:
            for s in [s for s in self.waiting if s.cancelled]:
                self.waiting.remove(s)
                self._retire(s)
            take = [self.waiting.popleft() for _ in range(min(self.slots.free_rows, len(self.waiting)))]
            self.stats.waiting = len(self.waiting)
        return take

    @torch.inference_mode()
    def step(self) -> None:
        """Admit, decode one token for every active row, retire finished rows."""
        for row in reversed(range(len(self.rows))):
            if self.rows[row].cancelled:
                self._remove_row(row)
        self.joining = self._take_waiting()  # kept on self so that _fail_all reaches them too
        if self.joining:
            self._admit(self.joining)
        self.joining = []
        if self.rows:
            self._decode()
        self.stats.active = len(self.rows)

    def _admit(self, joining: list[Sequence]) -> None:
        """Prefill the joiners' distinct prompts as one left-padded batch (the n choices of a prompt share
        one prefill), move them into the slot cache, sample token 1 of every joiner."""
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(s.prompt), len(distinct)) for s in joining]  # joiner -> prefill row
        batch = left_pad([list(p) for p in distinct], self.pad_id, self.device)
        u, p = batch.ids.shape
        scratch = self.model.new_kv_cache(u, max_seq_len=p)
        mask = batch.valid if batch.has_padding else None
        logits = forward_last(self.model, batch.ids, batch.positions, mask, scratch)  # (U, V)
        self.slots.ensure_left_room(p)
        self.slots.insert(scratch, batch.valid[source], source)
        self.rows.extend(joining)
        self.stats.max_active = max(self.stats.max_active, len(self.rows))
        self._sample_and_push(logits[source], first_row=len(self.rows) - len(joining))

    def _decode(self) -> None:
        view, key_mask = self.slots.step_view()  # cache rows[:n], mask (n, c + 1)
        tokens = torch.tensor([[s.tokens[-1]] for s in self.rows], dtype=torch.long, device=key_mask.device)
        positions = torch.tensor([[s.last_position] for s in self.rows], dtype=torch.long, device=key_mask.device)
        logits = self.decode_step(tokens, positions, key_mask, view)  # (n, V)
        self.slots.finish_step(view)
        self.stats.steps += 1
        self.stats.decode_rows += len(self.rows)
        self._sample_and_push(logits, first_row=0)

    def _sample_and_push(self, logits: torch.Tensor, first_row: int) -> None:
        """logits (k, V) belong to rows first_row .. first_row+k-1: choose, push, retire finished."""
        seqs = self.rows[first_row : first_row + logits.shape[0]]
        plain = [i for i, s in enumerate(seqs) if s.params.greedy and not s.params.uses_counts]
        chosen: dict[int, int] = {}
        if plain:
            best = torch.argmax(logits[plain].float(), dim=-1).tolist()
            chosen.update(zip(plain, best))
        for i, s in enumerate(seqs):
            if i not in chosen:
                chosen[i] = int(choose_next_token(logits[i : i + 1], s.params, s.counts, s.generator)[0])
        for i, s in enumerate(seqs):
            s.push(chosen[i])
        self.stats.decoded_tokens += len(seqs)
        for row in reversed(range(first_row, first_row + len(seqs))):
            if self.rows[row].done:
                self._remove_row(row)

    def _remove_row(self, row: int) -> None:
        seq = self.rows[row]
        moved = self.slots.remove(row)
        if moved is not None:
            self.rows[row] = self.rows[moved]
        self.rows.pop()
        self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        if seq.cancelled and not seq.done:
            seq.cancel()
            self.stats.cancelled += 1
        elif seq.done:
            self.stats.completed += 1

    def _fail_all(self, message: str) -> None:
        """After an internal error: fail every running and waiting sequence and start clean."""
        with self._cond:
            victims = self.rows + [s for s in self.joining if s not in self.rows] + list(self.waiting)
            self.waiting.clear()
            self.joining = []
        for s in victims:
            s.fail(message)
        self.stats.errors += len(victims)
        self.rows = []
        while self.slots.rows:
            self.slots.remove(self.slots.rows - 1)
