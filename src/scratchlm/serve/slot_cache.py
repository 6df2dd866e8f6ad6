"""A KV cache whose rows come and go: the memory behind step-level (continuous) batching.

One pre-allocated `KVCache` of R rows x M slots (M = the served context: the model's max_seq_len or less) is shared by every
running sequence. All rows write their next token at the same slot, the cursor c (= cache.seq_len),
so one decode step serves the whole batch; each row keeps its own positions (passed to the model)
and a key mask `valid` (R, M), True = a real token of that row. Active rows are packed densely into
rows 0 .. n-1, so a step runs on the prefix view rows[:n] (no work for empty rows).

    join:   a prompt of P tokens is prefilled alone (or with the other joiners, left padded) into a
            scratch cache, then copied into a free row at slots [c - P, c) (into n rows for n choices). If c < P every active row
            is first shifted right by P - c (RoPE keys are stored already rotated with their own
            positions, so moving them between slots changes nothing).
    leave:  the last active row is copied into the freed row (one row copy) and n -= 1.
    room:   before a step needs slot c = M, all rows are shifted left by the first slot any row still
            uses (>= 1: a row that still decodes holds at most M - 2 tokens). The same left shift happens
            earlier once the unused leading slots outnumber the live ones (and MIN_COMPACT): a step attends
            over every slot before the cursor, so a long-gone row must not keep the window long.
    empty:  when the last row leaves, c is reset to 0.
"""

from __future__ import annotations

import torch

from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache

MIN_COMPACT = 32  # unused leading slots worth a left shift before the cursor reaches the end


class RowPrefixView(KVCache):
    """The first `rows` rows of a parent KVCache, sharing its memory (writes land in the parent)."""

    def __init__(self, parent: KVCache, rows: int) -> None:  # no super().__init__: nothing is allocated
        self.k = parent.k[:, :rows]  # (L, rows, KvH, M, Hd) view
        self.v = parent.v[:, :rows]
        self.max_seq_len = parent.max_seq_len
        self.batch_size = rows
        self.seq_len = parent.seq_len


class SlotCache:
    """R rows sharing one slot cursor; see the module docstring for the join / leave / room rules."""

    def __init__(self, model: TransformerLM, max_rows: int, slots: int | None = None) -> None:
        """slots: M, the context served (default the model's max_seq_len); memory = 2 L R M KvH Hd elements."""
        if max_rows < 1:
            raise ValueError(f"the batch needs at least 1 row, got max_batch={max_rows}; use --max-batch 1 or more")
        self.cache = model.new_kv_cache(max_rows, max_seq_len=slots)
        self.max_rows = max_rows
        self.slots = self.cache.max_seq_len  # M
        self.valid = torch.zeros(max_rows, self.slots, dtype=torch.bool, device=self.cache.k.device)  # (R, M)
        self.rows = 0  # active rows are 0 .. rows-1
        self.shifts = {"left": 0, "right": 0}  # how often rows were moved (tests check both paths run)

    @property
    def cursor(self) -> int:
        """The slot the next decode step writes for every row."""
        return self.cache.seq_len

    @property
    def free_rows(self) -> int:
        return self.max_rows - self.rows

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
        """Make c >= prompt_len so a prompt fits to the left of the cursor."""
        if self.rows == 0:
            self.cache.seq_len = 0
        if prompt_len > self.slots - 1:
            raise ValueError(f"prompt of {prompt_len} tokens does not fit the {self.slots}-slot cache")
        if self.cursor < prompt_len:
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
        if first < 1:
            raise RuntimeError("slot cache is full: a row holds every slot (prompt + max_tokens > context?)")
        self._shift(-first)

    def insert(self, scratch: KVCache, valid: torch.Tensor, source_rows: list[int] | None = None) -> list[int]:
        """Copy prefilled rows of the scratch cache (P slots) into J free rows at slots [c - P, c), with
        their key mask valid (J, P); row i comes from scratch row source_rows[i] (default i), so one
        prefill can seed several rows (n choices of one prompt). Returns the rows they got. Call
        ensure_left_room(P) first."""
        j, p = valid.shape
        c, first = self.cursor, self.rows
        if j > self.free_rows or p > c:
            raise RuntimeError(f"cannot insert {j} rows of {p} slots (free rows {self.free_rows}, cursor {c})")
        src = list(range(j)) if source_rows is None else source_rows
        rows = slice(first, first + j)
        self.cache.k[:, rows, :, c - p : c] = scratch.k[:, src, :, :p]  # (L, J, KvH, P, Hd)
        self.cache.v[:, rows, :, c - p : c] = scratch.v[:, src, :, :p]
        self.valid[rows] = False
        self.valid[rows, c - p : c] = valid
        self.rows += j
        return list(range(first, first + j))

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
        return moved

    def step_view(self) -> tuple[RowPrefixView, torch.Tensor]:
        """Open slot c for every active row; return the (n rows) cache view and key mask (n, c + 1)."""
        self.ensure_step_room()
        c, n = self.cursor, self.rows
        self.valid[:n, c] = True
        return RowPrefixView(self.cache, n), self.valid[:n, : c + 1]

    def finish_step(self, view: RowPrefixView) -> None:
        """Adopt the cursor the model advanced on the view."""
        self.cache.seq_len = view.seq_len
