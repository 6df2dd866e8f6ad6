"""Step-level continuous batching over paged K/V memory: sequences join and leave the running batch between
decode steps.

The generation engine (scratchlm.generate.engine) runs a fixed batch from prefill to the end; a server
needs rows to come and go. This scheduler builds that step loop on the engine's pieces (generate's prefill,
decode steps and samplers) and a block pool (serve/kv_space.py): every sequence's K/V live in blocks of one
pool, listed in its block table, shared with other sequences and the prefix cache where the tokens agree.
One background thread repeats:

    1. drop cancelled sequences; admit waiting ones while a batch row and blocks for their prompt are free
       (a prompt's cached prefix is shared, not copied; the n choices of a prompt share one prefill), else
       they keep waiting (FIFO)
    2. prefill: at most `prefill_chunk` prompt tokens this step (serve/joining.py), so a long prompt is
       prefilled in chunks between the running rows' decode steps; a prompt whose last chunk ran chooses
       token 1 of each of its choices, which join the running rows
    3. one decode step for all n running rows (serve/batch_rows.py: the model's forward over the block
       tables for decode="model", the packed C++ step on a contiguous window otherwise): logits (n, V);
       each row chooses with its own params, constraint and logprobs (serve/token_choice.py)
    4. finished rows leave: their blocks go to the prefix cache (full ones) and back to the pool
Before a step every row gets room for its next token; when the pool is out of blocks (after reclaiming what
only the prefix cache holds) the most recently admitted row is preempted: its blocks are freed and it waits
again at the head of the queue, to be prefilled anew (its prompt + the tokens it generated) and go on
exactly where it stopped (vLLM's recompute preemption).

The waiting queue is bounded (`max_queue` sequences): `submit` raises QueueFull beyond it.
`abort(message)` fails every sequence at the next step boundary (graceful shutdown).
Everything here runs on the scheduler thread; other threads call submit() / cancel() / abort() only.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from scratchlm.generate.decode_step import DECODE_MODES, DecodeStep, chunk_decoder, make_decode_step
from scratchlm.generate.prefill import PREFILL_MODES
from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import BlockTable, PoolExhausted
from scratchlm.generate.speculative import Speculation
from scratchlm.serve.batch_rows import NativeRows, PagedRows, StagedRows, pool_decoder
from scratchlm.serve.joining import Joiner, prefill_step
from scratchlm.serve.scheduler_thread import QueueFull, SchedulerStats, SchedulerThread
from scratchlm.serve.kv_space import BLOCK, KVSpace
from scratchlm.serve.sequence import Sequence
from scratchlm.serve.speculation import SpeculativeRows
from scratchlm.serve.token_choice import choose_tokens

SERVE_DECODE_MODES = tuple(m for m in DECODE_MODES if m != "compiled")  # compiled: recompiles per batch size
__all__ = ["QueueFull", "SERVE_DECODE_MODES", "Scheduler", "SchedulerStats"]


class Scheduler(SchedulerThread):
    """Runs every submitted Sequence to completion in a shared, changing batch (see the module docstring).

    kv_blocks: the pool's size in blocks (default: enough for max_batch rows x the context, pages touched
    by use); prefix_blocks: how many of them the prefix cache may name (0 = off); prefill_chunk: prompt
    tokens prefilled per step at most."""

    def __init__(self, model: TransformerLM, max_batch: int = 32, pad_id: int = 0, decode: str = "model",
                 max_queue: int = 256, context: int | None = None, prefill: str = "model",
                 kv_blocks: int | None = None, prefix_blocks: int = 0, prefill_chunk: int = 512,
                 speculation: Speculation | None = None) -> None:
        if decode not in SERVE_DECODE_MODES:
            raise ValueError(f"unknown decode mode {decode!r} for serving; valid: {SERVE_DECODE_MODES}")
        if prefill not in PREFILL_MODES:
            raise ValueError(f"unknown prefill mode {prefill!r}; valid: {PREFILL_MODES}")
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must be >= 0 (0 = no waiting: busy means 429)")
        if max_batch < 1:
            raise ValueError(f"the batch needs at least 1 row, got max_batch={max_batch}; use --max-batch 1 or more")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk} must be >= 1 token")
        self.model = model.eval()
        self.prefill, self.prefill_chunk, self.max_batch = prefill, prefill_chunk, max_batch
        self.context = context or model.config.max_seq_len
        if kv_blocks is None:
            kv_blocks = max_batch * -(-self.context // BLOCK)
        self.space = KVSpace(model, kv_blocks, prefix_blocks, BLOCK)
        self.speculation = speculation
        if speculation is not None:  # drafts verified over the block tables (serve/speculation.py)
            self.rows_impl = SpeculativeRows(self.model, self.space, speculation, decode, self.context, kv_blocks)
        elif decode == "model":
            self.rows_impl = PagedRows(self.space, self._flushing(make_decode_step(self.model, decode)))
        elif (native := pool_decoder(self.model, decode, self.space)) is not None:
            # the C++ step reads and writes the rows' blocks itself
            self.rows_impl = NativeRows(self.space, native, self._flushing)
        else:
            self.rows_impl = StagedRows(self.model, self.space, self._flushing(make_decode_step(self.model, decode)),
                                        max_batch, self.context)
        # the decode step's C++ object when it has one: short prompt chunks run through it (serve/joining.py)
        self.chunk_decoder = None if speculation is not None else chunk_decoder(self.model, decode)
        self.device = self.space.pool.k.device
        self.pad_id = pad_id
        self.rows: list[Sequence] = []  # rows[i] is the sequence in batch row i
        self.joiners: list[Joiner] = []  # admitted, being prefilled
        self._admitted = 0
        super().__init__(max_queue)
        self.stats.kv_blocks_total = self.space.pool.capacity

    @property
    def prefix_cache(self):
        return self.space.prefix

    @property
    def slots(self):
        """The fast step's SlotCache window (None for decode="model")."""
        return getattr(self.rows_impl, "slots", None)

    @property
    def seats_taken(self) -> int:
        return len(self.rows) + sum(len(j.seqs) for j in self.joiners)

    def busy(self) -> bool:
        return bool(self.waiting or self.rows or self.joiners)

    # ---- admission and prefill -----------------------------------------------------------------
    def _admit(self) -> None:
        """Waiting sequences become joiners, first come first served, while a seat and blocks are free."""
        with self._cond:
            for s in [s for s in self.waiting if s.cancelled]:
                self.waiting.remove(s)
                self._retire(s)
            self.stats.waiting = len(self.waiting)
        while True:
            with self._cond:
                if not self.waiting or self.seats_taken >= self.max_batch:
                    return
                head = self.waiting[0]
            group = self._group(head)
            if not self._start_joiner(group):
                return
            with self._cond:
                for s in group:
                    self.waiting.remove(s)
                self.stats.waiting = len(self.waiting)

    def _group(self, head: Sequence) -> list[Sequence]:
        """The head and the waiting choices of the same prompt right behind it (a request's n choices), as
        many as seats allow; a preempted sequence comes back alone."""
        if head.started:
            return [head]
        group = [head]
        with self._cond:
            for s in list(self.waiting)[1:]:
                if len(group) >= self.max_batch - self.seats_taken or s.started or s.prompt != head.prompt \
                        or s.needs_prompt_logprobs != head.needs_prompt_logprobs:
                    break
                group.append(s)
        return group

    def _start_joiner(self, group: list[Sequence]) -> bool:
        """Admit `group` as one joiner with blocks for its whole prompt; False (nothing changed) when the pool
        cannot hold it now without taking the running rows' next blocks."""
        head = group[0]
        ids = head.prompt + head.tokens[:-1] if head.started else list(head.prompt)
        scored = head.needs_prompt_logprobs
        table = BlockTable() if scored else self.space.start(ids)
        bs = self.space.block
        copies = len(group) - 1 if len(ids) % bs else 0  # the choices' own copies of the last, partial block
        need = self.space.blocks_for(len(ids)) - len(table.blocks) + copies
        headroom = sum(1 for s in self.rows if s.kv.room(bs) == 0)  # rows that need a block at the next step
        if need + headroom > self.space.available() or not self.space.grow(table, len(ids) - table.length):
            self.space.release(table)
            return False
        for s in group:
            s.admitted, self._admitted = self._admitted, self._admitted + 1
        top_n = max(s.top_logprobs for s in group) if scored else None
        self.joiners.append(Joiner(ids, group, table, cached=table.length, top_n=top_n, resumed=head.started))
        return True

    def _prefill(self) -> None:
        """This step's prefill chunks; joiners whose prompt is complete enter the running rows."""
        prefill_step(self.model, self.space, self.joiners, self.prefill_chunk, self.prefill, self.chunk_decoder)
        done = [j for j in self.joiners if j.done]
        self.joiners = [j for j in self.joiners if not j.done]
        for j in done:
            self._enter(j)

    def _enter(self, j: Joiner) -> None:
        """A prefilled joiner's sequences take their tables and rows; fresh ones choose token 1."""
        if j.resumed:
            seq = j.seqs[0]
            seq.kv = j.table
            self._add_rows([seq])
            return
        placed = []
        for i, s in enumerate(j.seqs):
            try:
                s.kv = j.table if i == 0 else self.space.fork(j.table)
                placed.append(s)
            except PoolExhausted:  # no block for this choice's copy of the last block: it waits again
                with self._cond:
                    self.waiting.appendleft(s)
        entering = []
        for s in placed:
            s.cached_tokens = j.cached
            self.stats.prompt_tokens += len(s.prompt)
            self.stats.cached_prompt_tokens += j.cached
            s.start(j.prompt_logprobs if s.needs_prompt_logprobs else None)
            if s.done:  # max_tokens 0: the prompt was all it wanted
                self._release(s)
                self._retire(s)
            else:
                entering.append(s)
        if entering:
            self._add_rows(entering)
            logits = torch.stack([j.logits] * len(entering))  # (J, V)
            self._choose_and_push(logits, first_row=len(self.rows) - len(entering))

    def _add_rows(self, seqs: list[Sequence]) -> None:
        self.rows_impl.add(seqs)
        self.rows.extend(seqs)
        self.stats.max_active = max(self.stats.max_active, len(self.rows))

    # ---- decode -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> None:
        """Admit, prefill (a chunk's worth), decode one token for every running row, retire finished rows."""
        for row in reversed(range(len(self.rows))):
            if self.rows[row].cancelled:
                self._remove_row(row)
        for j in [j for j in self.joiners if all(s.cancelled for s in j.seqs)]:
            self.joiners.remove(j)
            self.space.release(j.table)
            for s in j.seqs:
                self._retire(s)
        self._admit()
        if self.joiners:
            self.flush_wakes()  # the event loops stream while the model runs (serve/scheduler_thread.py)
            self._prefill()
        if self.rows:
            self._make_room()
        if self.rows:
            self._decode()
        self._update_stats()

    def _flushing(self, step: DecodeStep) -> DecodeStep:
        """step, handing the deferred wake-ups to the event loops first (they stream while it computes)."""
        def run(*args: Any) -> torch.Tensor:
            self.flush_wakes()
            return step(*args)
        return run

    def _make_room(self, needs: dict[int, int] | None = None) -> None:
        """Room in every row's table for its next token (needs[id(seq)] tokens with drafts); preempt the newest
        rows while the pool is short."""
        i = 0
        while i < len(self.rows):
            s = self.rows[i]
            if self.space.grow(s.kv, 1 if needs is None else needs[id(s)]):
                i += 1
                continue
            self._preempt(max(range(len(self.rows)), key=lambda r: self.rows[r].admitted))
            i = 0  # rows moved: check them again

    def _preempt(self, row: int) -> None:
        """Free the row's blocks and send it back to the head of the queue (it resumes where it stopped)."""
        seq = self.rows[row]
        self._drop_row(row)
        self.space.release(seq.kv)
        seq.kv = None
        self._release_draft(seq)
        with self._cond:
            self.waiting.appendleft(seq)
        self.stats.preempted += 1

    def _release_draft(self, seq: Sequence) -> None:
        if self.speculation is not None:
            self.rows_impl.release(seq)

    def _decode(self) -> None:
        if self.speculation is not None:
            self._decode_speculative()
            return
        logits = self.rows_impl.decode(self.rows)  # (n, V)
        self.stats.steps += 1
        self.stats.decode_rows += len(self.rows)
        self._choose_and_push(logits, first_row=0)

    def _decode_speculative(self) -> None:
        """Draft, make room for the drafts, verify them all in one forward, push what each row emits."""
        self.flush_wakes()
        drafts = dict(zip(map(id, self.rows), self.rows_impl.drafts(self.rows)))
        self._make_room({key: 1 + len(d) for key, (d, _) in drafts.items()})
        if not self.rows:
            return
        emitted = self.rows_impl.decode(self.rows, [drafts[id(s)] for s in self.rows])
        self.stats.steps += 1
        self.stats.decode_rows += len(self.rows)
        self._push(list(self.rows), emitted, first_row=0)

    def _choose_and_push(self, logits: torch.Tensor, first_row: int) -> None:
        """logits (k, V) belong to rows first_row .. first_row+k-1: choose, push, retire finished."""
        seqs = self.rows[first_row : first_row + logits.shape[0]]
        self._push(seqs, [[pick] for pick in choose_tokens(logits, seqs)], first_row)

    def _push(self, seqs: list[Sequence], emitted: list[list[tuple[int, Any]]], first_row: int) -> None:
        """Push each row's tokens in order (a row that finishes drops the rest), retire finished rows."""
        count = 0
        for s, tokens in zip(seqs, emitted):
            for token, info in tokens:
                if s.done:
                    break
                s.push(token, info)
                count += 1
        self.stats.decoded_tokens += count
        now = time.monotonic()
        with self._cond:
            self.recent.append((now, count))
            while self.recent and self.recent[0][0] < now - 60:
                self.recent.popleft()
        for row in reversed(range(first_row, first_row + len(seqs))):
            if self.rows[row].done:
                self._remove_row(row)

    def _drop_row(self, row: int) -> None:
        """Take row `row` out of the batch (the last row moves into it)."""
        moved = self.rows_impl.remove(row)
        if moved is not None:
            self.rows[row] = self.rows[moved]
        self.rows.pop()

    def _remove_row(self, row: int) -> None:
        seq = self.rows[row]
        self._drop_row(row)
        self._release(seq)
        self._retire(seq)

    def _release(self, seq: Sequence) -> None:
        """Offer the sequence's full blocks (prompt + generated tokens but the last, never fed) to the prefix
        cache, then give its blocks back."""
        if seq.kv is None:
            return
        self.space.offer(seq.prompt + seq.tokens[:-1], seq.kv)
        self.space.release(seq.kv)
        seq.kv = None
        self._release_draft(seq)

    def _retire(self, seq: Sequence) -> None:
        if seq.cancelled and not seq.done:
            seq.cancel()
            self.stats.cancelled += 1
        elif seq.done:
            self.stats.completed += 1

    def _update_stats(self) -> None:
        pool = self.space.pool
        self.stats.active = len(self.rows)
        self.stats.prefilling = sum(len(j.seqs) for j in self.joiners)
        self.stats.kv_blocks_used, self.stats.kv_blocks_high_water = pool.used, pool.high_water
        self.stats.decode_window_bytes = self.rows_impl.nbytes

    def _fail_all(self, message: str) -> None:
        """Fail every running and waiting sequence and start clean (internal error, or shutdown)."""
        with self._cond:
            joined = [s for j in self.joiners for s in j.seqs]
            victims = self.rows + [s for s in joined if s not in self.rows] + list(self.waiting)
            self.waiting.clear()
            self.stats.waiting = 0
        for s in victims:
            if not s.done:
                s.fail(message)
                self.stats.errors += 1
        for s in self.rows:
            if s.kv is not None:
                self.space.release(s.kv)
                s.kv = None
            self._release_draft(s)
        for j in self.joiners:
            if j.table.blocks:
                self.space.release(j.table)
        self.joiners, self.rows = [], []
        self.rows_impl.clear()
        self._update_stats()
