"""The running rows' decode step over their block tables, two ways (the decode mode picks one).

    PagedRows    decode="model": the model's own forward on a PagedKVCache view of the rows' block tables
                 (the reference path: attention gathers each row's keys from its blocks)
    StagedRows   the packed fast steps (decode "auto" / "fast*", generate/fast_decode.py): their C++ step reads a
                 contiguous per-layer cache, so the rows' K/V are copied once into a SlotCache window when they
                 join, the step runs there, and each step's new K/V (one slot per row) are written through to the
                 rows' blocks, which stay the K/V of record (prefix sharing, preemption, the next prefill)
Both keep rows[i] <-> row i; remove(i) moves the last row into i (the scheduler mirrors it). decode(rows) feeds
every row's newest token at its position and returns the next-token logits (n, V); before it, each row's
table must have room for one more token.
"""

from __future__ import annotations

import torch

from scratchlm.generate.decode_step import DecodeStep
from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import PagedKVCache
from scratchlm.serve.kv_space import KVSpace
from scratchlm.serve.sequence import Sequence
from scratchlm.serve.slot_cache import SlotCache


def _inputs(rows: list[Sequence], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.tensor([[s.tokens[-1]] for s in rows], dtype=torch.long, device=device)  # (n, 1)
    positions = torch.tensor([[s.last_position] for s in rows], dtype=torch.long, device=device)  # (n, 1)
    return tokens, positions


class PagedRows:
    """decode="model": every step attends over the block tables (see the module docstring)."""

    def __init__(self, space: KVSpace, step: DecodeStep) -> None:
        self.space, self.step = space, step
        self.count = 0

    def add(self, seqs: list[Sequence]) -> None:
        self.count += len(seqs)

    def remove(self, row: int) -> int | None:
        self.count -= 1
        return self.count if row != self.count else None

    def clear(self) -> None:
        self.count = 0

    def decode(self, rows: list[Sequence]) -> torch.Tensor:
        view = PagedKVCache(self.space.pool, [s.kv for s in rows]).expect(1)
        tokens, positions = _inputs(rows, self.space.pool.k.device)
        return self.step(tokens, positions, view.key_mask(), view)  # (n, V); the view stored the new K/V

    @property
    def nbytes(self) -> int:
        return 0


class StagedRows:
    """The packed fast step on a SlotCache window, written through to the blocks (see the module docstring)."""

    def __init__(self, model: TransformerLM, space: KVSpace, step: DecodeStep, max_rows: int, context: int) -> None:
        self.space, self.step = space, step
        self.slots = SlotCache(model, max_rows, context)

    @property
    def count(self) -> int:
        return self.slots.rows

    def add(self, seqs: list[Sequence]) -> None:
        """Copy the joining rows' K/V from their blocks into the window."""
        self.slots.ensure_left_room(max(s.kv.length for s in seqs))
        for s in seqs:
            k, v = self.space.pool.read(s.kv)  # (L, KvH, P, Hd)
            self.slots.insert(k, v)

    def remove(self, row: int) -> int | None:
        return self.slots.remove(row)

    def clear(self) -> None:
        while self.slots.rows:
            self.slots.remove(self.slots.rows - 1)

    def decode(self, rows: list[Sequence]) -> torch.Tensor:
        view, key_mask = self.slots.step_view()  # cache rows[:n], mask (n, c + 1)
        tokens, positions = _inputs(rows, key_mask.device)
        logits = self.step(tokens, positions, key_mask, view)  # (n, V)
        k, v = self.slots.finish_step(view)  # (L, n, KvH, Hd): the step's new K/V
        pool, bs = self.space.pool, self.space.block
        slots = [s.kv.blocks[s.kv.length // bs] * bs + s.kv.length % bs for s in rows]  # each row's next slot
        pool.write_slots(torch.tensor(slots, device=k.device), k, v)
        for s in rows:
            s.kv.length += 1
        return logits

    @property
    def nbytes(self) -> int:
        return self.slots.nbytes
