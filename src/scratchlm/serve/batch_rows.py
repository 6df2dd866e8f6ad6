"""The running rows' decode step over their block tables, three ways (the decode mode picks one).

    PagedRows    decode="model": the model's own forward on a PagedKVCache view of the rows' block tables
                 (the reference path: attention gathers each row's keys from its blocks)
    NativeRows   the fast modes whose whole step runs in C++ (FastDecoder.paged: decode "auto" / "fast*" on a
                 Llama-family model with the kernels built): the step reads and writes the rows' blocks itself,
                 each row attending over its own length (no window, no copy, no padding)
    StagedRows   the other packed fast steps (generate/fast_decode.py's torch step): that step reads a
                 contiguous per-layer cache, so the rows' K/V are copied once into a SlotCache window when they
                 join, the step runs there, and each step's new K/V (one slot per row) are written through to the
                 rows' blocks, which stay the K/V of record (prefix sharing, preemption, the next prefill).
                 Rows of very different lengths go to separate windows (one step call each), so short rows do
                 not attend over a long row's width
Both keep rows[i] <-> row i; remove(i) moves the last row into i (the scheduler mirrors it). decode(rows) feeds
every row's newest token at its position and returns the next-token logits (n, V); before it, each row's
table must have room for one more token.
"""

from __future__ import annotations

import torch

from scratchlm.generate.decode_step import DecodeStep, native_decoder
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import PagedKVCache
from scratchlm.serve.kv_space import KVSpace
from scratchlm.serve.sequence import Sequence
from scratchlm.serve.slot_cache import SlotCache

WASTE_LIMIT = 512  # padded slot-rows a window may take on for a new row before it gets a window of its own
MAX_WINDOWS = 4


def pool_decoder(model: TransformerLM, decode: str, space: KVSpace) -> FastDecoder | None:
    """The decode mode's FastDecoder with a C++ step that can run on space's block tables (an fp32 pool), or
    None: then the rows go through the torch step or the forward."""
    native = native_decoder(model, decode)
    return native if native is not None and space.pool.k.dtype == torch.float32 else None


def _inputs(rows: list[Sequence], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.tensor([[s.tokens[-1]] for s in rows], dtype=torch.long, device=device)  # (n, 1)
    positions = torch.tensor([[s.last_position] for s in rows], dtype=torch.long, device=device)  # (n, 1)
    return tokens, positions


class CountedRows:
    """The scheduler's rows bookkeeping for row sets that keep no per-row state (the rows' block tables hold
    it): only how many rows run. remove(row) returns the row that moves into `row`'s place (the last one), or
    None when `row` was the last."""

    count = 0

    def add(self, seqs: list[Sequence]) -> None:
        self.count += len(seqs)

    def remove(self, row: int) -> int | None:
        self.count -= 1
        return self.count if row != self.count else None

    def clear(self) -> None:
        self.count = 0


class PagedRows(CountedRows):
    """decode="model": every step attends over the block tables (see the module docstring)."""

    def __init__(self, space: KVSpace, step: DecodeStep) -> None:
        self.space, self.step = space, step
        self.count = 0

    def decode(self, rows: list[Sequence]) -> torch.Tensor:
        view = PagedKVCache(self.space.pool, [s.kv for s in rows]).expect(1)
        tokens, positions = _inputs(rows, self.space.pool.k.device)
        return self.step(tokens, positions, view.key_mask(), view)  # (n, V); the view stored the new K/V

    @property
    def nbytes(self) -> int:
        return 0


class NativeRows(CountedRows):
    """The C++ step over the rows' block tables (see the module docstring). `step(tokens, positions, tables)`
    is the decoder's `paged` (wrapped by the scheduler to hand over wake-ups first)."""

    def __init__(self, space: KVSpace, decoder: FastDecoder, wrap=lambda f: f) -> None:
        self.space = space
        pool = space.pool
        self.step = wrap(lambda tokens, positions, tables: decoder.paged(tokens, positions, pool, tables))
        self.count = 0

    def decode(self, rows: list[Sequence]) -> torch.Tensor:
        tokens, positions = _inputs(rows, self.space.pool.k.device)
        return self.step(tokens, positions, [s.kv for s in rows])  # (n, V); each table advanced by one

    @property
    def nbytes(self) -> int:
        return 0


class StagedRows:
    """The packed fast step on SlotCache windows, written through to the blocks (see the module docstring).

    Every step attends over each window's whole width, padding included, so one long row in a window of short
    ones makes all of them pay for its length. Rows therefore go to the window where they add the fewest
    padded slots (rows x width - tokens); when that exceeds WASTE_LIMIT slot-rows a new window opens (at most
    MAX_WINDOWS), which costs one more pass over the weights per step instead. where[i] = (window, row in it)
    of scheduler row i; remove() keeps the scheduler's "last row moves into the freed one" order."""

    def __init__(self, model: TransformerLM, space: KVSpace, step: DecodeStep, max_rows: int, context: int) -> None:
        self.space, self.step = space, step
        self.model, self.max_rows, self.context = model, max_rows, context
        self.windows: list[SlotCache] = []
        self.owner: list[list[int]] = []  # owner[w][r] = the scheduler row in window w's row r
        self.where: list[tuple[int, int]] = []

    @property
    def slots(self) -> SlotCache:
        """The first window (tests look at its shifts)."""
        if not self.windows:
            self._open()
        return self.windows[0]

    @property
    def count(self) -> int:
        return len(self.where)

    def _open(self) -> int:
        self.windows.append(SlotCache(self.model, self.max_rows, self.context))
        self.owner.append([])
        return len(self.windows) - 1

    def _pick(self, n: int) -> int:
        """The window a row of n tokens adds the fewest padded slots to (a new one past WASTE_LIMIT)."""
        best, cost = None, None
        for w, win in enumerate(self.windows):
            rows, span = win.rows, win.span
            added = 0 if rows == 0 else (rows + 1) * max(span, n) - rows * span - n
            if cost is None or added < cost:
                best, cost = w, added
        if best is None or (cost > WASTE_LIMIT and len(self.windows) < MAX_WINDOWS):
            return self._open()
        return best

    def add(self, seqs: list[Sequence]) -> None:
        """Copy the joining rows' K/V from their blocks into their windows."""
        for s in seqs:
            w = self._pick(s.kv.length)
            win = self.windows[w]
            win.ensure_left_room(s.kv.length)
            k, v = self.space.pool.read(s.kv)  # (L, KvH, P, Hd)
            r = win.insert(k, v)
            self.owner[w].append(len(self.where))
            self.where.append((w, r))

    def remove(self, row: int) -> int | None:
        w, r = self.where[row]
        moved = self.windows[w].remove(r)  # that window's last row moves into r
        if moved is not None:
            self.owner[w][r] = self.owner[w][moved]
            self.where[self.owner[w][r]] = (w, r)
        self.owner[w].pop()
        last = len(self.where) - 1
        if row != last:  # the scheduler moves its last row into `row`
            lw, lr = self.where[last]
            self.where[row] = (lw, lr)
            self.owner[lw][lr] = row
        self.where.pop()
        return last if row != last else None

    def clear(self) -> None:
        self.windows, self.owner, self.where = [], [], []

    def decode(self, rows: list[Sequence]) -> torch.Tensor:
        out: torch.Tensor | None = None
        for win, owned in zip(self.windows, self.owner):
            if not owned:
                continue
            members = [rows[i] for i in owned]
            view, key_mask = win.step_view()  # window rows[:n], mask (n, c + 1)
            tokens, positions = _inputs(members, key_mask.device)
            logits = self.step(tokens, positions, key_mask, view)  # (n, V)
            k, v = win.finish_step(view)  # (L, n, KvH, Hd): the step's new K/V
            pool, bs = self.space.pool, self.space.block
            slots = [s.kv.blocks[s.kv.length // bs] * bs + s.kv.length % bs for s in members]  # each row's next slot
            pool.write_slots(torch.tensor(slots, device=k.device), k, v)
            for s in members:
                s.kv.length += 1
            if len(owned) == len(rows) and owned == list(range(len(rows))):
                return logits  # one window holds every row, in order (the common case): no copy
            if out is None:
                out = logits.new_empty(len(rows), logits.shape[1])
            out[owned] = logits
        return out

    @property
    def nbytes(self) -> int:
        return sum(win.nbytes for win in self.windows)
