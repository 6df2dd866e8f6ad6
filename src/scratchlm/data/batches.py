"""Batches of next-token windows from a token file (numpy memmap or array of ids).

A window starting at i gives x = data[i : i+T], y = data[i+1 : i+T+1] (y is x shifted by one).
Shapes: x, y (B, T) int64.

- `get_batch(data, B, T)`: B windows at uniform random starts in [0, N - T - 1].
- `step_starts(...)`: the random starts of one optimizer step as a pure function of (seed, step), so
  a resumed run draws exactly the same data without any sampler state.
- `SequentialBatches`: epochs over the non-overlapping windows [kT, kT + T + 1), shuffled per epoch
  from (seed, epoch); its position (epoch, cursor) is saved in checkpoints.
- `iter_epoch(data, B, T)`: one ordered pass over the non-overlapping windows (evaluation).
- `train_val_split(data, val_fraction)`: first part train, last part validation (views, no copy).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch


def check_length(data: np.ndarray, seq_len: int, what: str = "token data") -> None:
    """A window needs T + 1 tokens; raise a ValueError naming the sizes and the fix otherwise."""
    if len(data) < seq_len + 1:
        raise ValueError(
            f"{what} has {len(data)} tokens but seq_len={seq_len} needs at least {seq_len + 1} "
            "(T + 1 for the shifted targets); use more text or a smaller seq_len"
        )


def windows(data: np.ndarray, starts: torch.Tensor | np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the windows at `starts` (B,) into x, y (B, T) int64."""
    rows = np.stack([np.asarray(data[int(s): int(s) + seq_len + 1], dtype=np.int64) for s in starts])  # (B, T+1)
    t = torch.from_numpy(rows)
    return t[:, :-1], t[:, 1:]


def get_batch(
    data: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """B random windows: x, y (B, T) int64 with y[:, t] = x[:, t+1] = data[start + t + 1]."""
    check_length(data, seq_len)
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=generator)
    return windows(data, starts, seq_len)


def step_starts(n_tokens: int, n_windows: int, seq_len: int, seed: int, step: int) -> torch.Tensor:
    """The random window starts of optimizer step `step`: a pure function of (seed, step)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63))
    return torch.randint(0, n_tokens - seq_len, (n_windows,), generator=g)


def train_val_split(data: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(first 1 - f, last f) of the tokens, as views of the memmap."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(len(data) * (1.0 - val_fraction))
    return data[:cut], data[cut:]


def iter_epoch(data: np.ndarray, batch_size: int, seq_len: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One ordered pass over the non-overlapping windows; the last batch may be smaller."""
    check_length(data, seq_len)
    starts = np.arange(0, len(data) - seq_len, seq_len)
    for i in range(0, len(starts), batch_size):
        yield windows(data, starts[i: i + batch_size], seq_len)


class SequentialBatches:
    """Epochs over non-overlapping windows, reshuffled per epoch; resumable from (epoch, cursor)."""

    def __init__(self, data: np.ndarray, seq_len: int, seed: int = 0, shuffle: bool = True) -> None:
        check_length(data, seq_len)
        self.data, self.seq_len, self.seed, self.shuffle = data, seq_len, seed, shuffle
        self.n_windows = (len(data) - 1) // seq_len
        self.epoch, self.cursor = 0, 0

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n_windows)
        return torch.randperm(self.n_windows, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))

    def next_starts(self, n: int) -> torch.Tensor:
        """The starts of the next n windows, crossing into the next epoch when this one runs out."""
        out = []
        order = self._order(self.epoch)
        while len(out) < n:
            if self.cursor == self.n_windows:
                self.epoch, self.cursor = self.epoch + 1, 0
                order = self._order(self.epoch)
            take = min(n - len(out), self.n_windows - self.cursor)
            out.extend((order[self.cursor: self.cursor + take] * self.seq_len).tolist())
            self.cursor += take
        return torch.tensor(out, dtype=torch.int64)

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(self.data, self.next_starts(batch_size), self.seq_len)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
