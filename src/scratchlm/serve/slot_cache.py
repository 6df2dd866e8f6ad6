"""The fast decode step's contiguous window of the running rows' K/V, sized by use.

The packed C++ step (generate/fast_decode.py, kernels llama_step.h) reads a contiguous per-layer cache
(L, R, KvH, M, Hd) whose rows all write the same slot each step. The K/V of record live in the block pool
(serve/kv_space.py); this is the decode step's copy of the running rows, kept up to date by one slot per
step (the scheduler writes each step's new K/V through to the rows' blocks), so a row's tokens are copied
here once, when it joins. (A kernel reading block tables directly would make this copy unnecessary.)

All rows write their next token at the same slot, the cursor c (= cache.seq_len), so one decode step serves the
whole batch; each row keeps its own positions (passed to the model) and a key mask `valid` (R, M), True = a real
token of that row. Active rows are packed densely into rows 0 .. n-1, so a step runs on the prefix view
rows[:n] (no work for empty rows).

    join:   a row of P tokens (from its blocks) goes into a free row at slots [c - P, c). If c < P every
            active row is first shifted right by P - c (RoPE keys are stored already rotated with their own
            positions, so moving them between slots changes nothing).
    leave:  the last active row is copied into the freed row (one row copy) and n -= 1.
    room:   before a step needs slot c = M, all rows are shifted left by the first slot any row still uses
            (>= 1: a row that still decodes holds at most M_max - 2 tokens), or the window grows. The same left
            shift happens earlier once the unused leading slots outnumber the live ones (and MIN_COMPACT): a step
            attends over every slot before the cursor, so a long-gone row must not keep the window long.
    size:   R x M start small (INITIAL_ROWS x INITIAL_SLOTS) and double as rows join and windows widen, up to
            max_rows x the served context; when the last row leaves, the window goes back to its initial size.
"""

from __future__ import annotations

import torch

from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache

MIN_COMPACT = 32  # unused leading slots worth a left shift before the cursor reaches the end
INITIAL_ROWS, INITIAL_SLOTS = 1, 256


class RowPrefixView(KVCache):
    """The first `rows` rows of a parent KVCache, sharing its memory (writes land in the parent)."""

    def __init__(self, parent: KVCache, rows: int) -> None:  # no super().__init__: nothing is allocated
        self.k = parent.k[:, :rows]  # (L, rows, KvH, M, Hd) view
        self.v = parent.v[:, :rows]
        self.max_seq_len = parent.max_seq_len
        self.batch_size = rows
        self.seq_len = parent.seq_len


class SlotCache:
    """R rows sharing one slot cursor; see the module docstring for the join / leave / room / size rules."""

    def __init__(self, model: TransformerLM, max_rows: int, slots: int | None = None) -> None:
        """slots: the most slots a row may need (the served context; default the model's max_seq_len)."""
        if max_rows < 1:
            raise ValueError(f"the batch needs at least 1 row, got max_batch={max_rows}; use --max-batch 1 or more")
        self.model = model
        self.max_rows, self.max_slots = max_rows, slots or model.config.max_seq_len
        self.rows = 0  # active rows are 0 .. rows-1
        self.shifts = {"left": 0, "right": 0}  # how often rows were moved (tests check both paths run)
        self._allocate(min(max_rows, INITIAL_ROWS), min(self.max_slots, INITIAL_SLOTS))

    def _allocate(self, rows: int, slots: int) -> None:
        self.cache = self.model.new_kv_cache(rows, max_seq_len=slots)
        self.valid = torch.zeros(rows, slots, dtype=torch.bool, device=self.cache.k.device)  # (R, M)

    def _resize(self, rows: int, slots: int) -> None:
        """Reallocate as rows x slots, keeping the active rows' slots [0, c)."""
        old, valid, c, n = self.cache, self.valid, self.cursor, self.rows
        self._allocate(rows, slots)
        self.cache.k[:, :n, :, :c] = old.k[:, :n, :, :c]
        self.cache.v[:, :n, :, :c] = old.v[:, :n, :, :c]
        self.valid[:n, :c] = valid[:n, :c]
        self.cache.seq_len = c

    @property
    def slots(self) -> int:
        """M: slots per row allocated now."""
        return self.cache.max_seq_len

    @property
    def capacity_rows(self) -> int:
        return self.cache.batch_size

    @property
    def nbytes(self) -> int:
        return (self.cache.k.numel() + self.cache.v.numel()) * self.cache.k.element_size()

    @property
    def span(self) -> int:
        """Slots a step attends over for the live rows: the cursor minus the first slot any row uses."""
        if self.rows == 0:
            return 0
        used = self.valid[: self.rows].any(dim=0).nonzero()
        return self.cursor - int(used[0, 0]) if used.numel() else 0

    @property
    def cursor(self) -> int:
        """The slot the next decode step writes for every row."""
        return self.cache.seq_len

    @property
    def free_rows(self) -> int:
        return self.max_rows - self.rows

    def _widen(self, slots: int) -> None:
        """At least `slots` slots per row (doubling, at most max_slots)."""
        if slots > self.slots:
            self._resize(self.capacity_rows, min(self.max_slots, max(slots, 2 * self.slots)))

    def _shift(self, d: int) -> None:
        """Move every active row's slots [0, c) to [d, c + d) (d > 0) or [g, c) to [0, c - g) (d = -g)."""
        c, n = self.cursor, self.rows
        src, dst = (slice(0, c), slice(d, c + d)) if d > 0 else (slice(-d, c), slice(0, c + d))
        for t in (self.cache.k, self.cache.v):
            t[:, :n, :, dst] = t[:, :n, :, src].clone()  # (L, n, KvH, ., Hd)
        self.valid[:n, dst] = self.valid[:n, src].clone()
        self.valid[:n, slice(0, d) if d > 0 else slice(c + d, c)] = False
        self.cache.seq_len = c + d
        self.shifts["right" if d > 0 else "left"] += 1

    def ensure_left_room(self, prompt_len: int) -> None:
        """Make c >= prompt_len so a row of that many tokens fits to the left of the cursor."""
        if self.rows == 0:
            self.cache.seq_len = 0
        if prompt_len > self.max_slots - 1:
            raise ValueError(f"a row of {prompt_len} tokens does not fit the {self.max_slots}-slot context")
        if self.cursor < prompt_len:
            self._widen(prompt_len + 1)
            self._shift(prompt_len - self.cursor)

    def ensure_step_room(self) -> None:
        """Make c <= M - 1 so the next decode step has a slot to write, and keep the attended window short:
        every step attends over slots [0, c], so once the slots no row uses any more ([0, first)) outnumber
        the live ones ([first, c)) and MIN_COMPACT, the rows move left by `first` (a copy of the live window,
        at most once per doubling of it)."""
        used = self.valid[: self.rows].any(dim=0).nonzero()  # (k, 1) slots some row uses
        first = int(used[0, 0]) if used.numel() else self.cursor
        if self.cursor < self.slots:
            if first >= MIN_COMPACT and first >= self.cursor - first:
                self._shift(-first)
            return
        if self.slots < self.max_slots and (first < 1 or self.cursor - first >= self.slots // 2):
            self._widen(self.slots + 1)  # the live window fills most of the rows: widen rather than shift
            return
        if first < 1:
            raise RuntimeError("slot cache is full: a row holds every slot (prompt + max_tokens > context?)")
        self._shift(-first)

    def insert(self, k: torch.Tensor, v: torch.Tensor) -> int:
        """A new row holding k, v (L, KvH, P, Hd) at slots [c - P, c); returns its index. Call
        ensure_left_room(P) first."""
        p, c, row = k.shape[2], self.cursor, self.rows
        if self.free_rows < 1 or p > c:
            raise RuntimeError(f"cannot insert a row of {p} slots (free rows {self.free_rows}, cursor {c})")
        if row >= self.capacity_rows:
            self._resize(min(self.max_rows, 2 * self.capacity_rows), self.slots)
        self.cache.k[:, row, :, c - p : c] = k  # (L, KvH, P, Hd)
        self.cache.v[:, row, :, c - p : c] = v
        self.valid[row] = False
        self.valid[row, c - p : c] = True
        self.rows += 1
        return row

    def remove(self, row: int) -> int | None:
        """Free `row`; the last active row moves into it. Returns that moved row's old index, or None."""
        last = self.rows - 1
        if not 0 <= row <= last:
            raise IndexError(f"row {row} is not active (active rows: 0..{last})")
        moved = None
        if row != last:
            for t in (self.cache.k, self.cache.v):
                t[:, row] = t[:, last]
            self.valid[row] = self.valid[last]
            moved = last
        self.valid[last] = False
        self.rows = last
        if self.rows == 0:
            self.cache.seq_len = 0
            if self.capacity_rows > INITIAL_ROWS or self.slots > INITIAL_SLOTS:  # give the memory back
                self._allocate(min(self.max_rows, INITIAL_ROWS), min(self.max_slots, INITIAL_SLOTS))
        return moved

    def step_view(self) -> tuple[RowPrefixView, torch.Tensor]:
        """Open slot c for every active row; return the (n rows) cache view and key mask (n, c + 1)."""
        self.ensure_step_room()
        c, n = self.cursor, self.rows
        self.valid[:n, c] = True
        return RowPrefixView(self.cache, n), self.valid[:n, : c + 1]

    def finish_step(self, view: RowPrefixView) -> tuple[torch.Tensor, torch.Tensor]:
        """Adopt the cursor the model advanced on the view; returns the step's new K/V (L, n, KvH, Hd) each."""
        self.cache.seq_len = view.seq_len
        c = view.seq_len - 1
        return self.cache.k[:, : self.rows, :, c], self.cache.v[:, : self.rows, :, c]
