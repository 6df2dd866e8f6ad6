"""Where a run's batches come from: token files, the train/val split, per-step and eval windows.

Global batch of one optimizer step: W ranks x A accumulation micro-steps x B windows, drawn as one
list of W*A*B starts (the same on every rank); rank r takes micro-batch m from slice
[(m*W + r)*B, (m*W + r + 1)*B). Hence 1 process with A=2 sees exactly the windows of 2 ranks with A=1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from scratchlm.data.batches import SequentialBatches, check_length, step_starts, train_val_split, windows
from scratchlm.data.token_file import open_token_file, read_token_meta


class DataSource:
    """Train/val token arrays plus the step -> micro-batches mapping described above."""

    def __init__(self, train_path: str, val_path: str, val_fraction: float, seq_len: int, sampler: str, seed: int):
        if not train_path:
            raise ValueError("TrainConfig.train_data is empty; pass --train_data=FILE.bin (a token file)")
        data = open_token_file(train_path)
        self.vocab_size = int(read_token_meta(train_path)["vocab_size"])
        if val_path:
            self.train, self.val = data, open_token_file(val_path)
            val_vocab = int(read_token_meta(val_path)["vocab_size"])
            if val_vocab != self.vocab_size:
                raise ValueError(f"val_data vocab_size {val_vocab} != train_data vocab_size {self.vocab_size}")
        else:
            check_length(data, seq_len, f"train_data {train_path}")
            self.train, self.val = train_val_split(data, val_fraction)
        check_length(self.train, seq_len, f"the training split of {Path(train_path).name}")
        check_length(self.val, seq_len, "the validation split (raise val_fraction or pass --val_data)")
        self.seq_len, self.sampler, self.seed = seq_len, sampler, seed
        self.sequential = SequentialBatches(self.train, seq_len, seed) if sampler == "sequential" else None

    def step_batches(self, step: int, batch_size: int, accum: int, rank: int, world: int):
        """The `accum` micro-batches (x, y) (B, T) of this rank for optimizer step `step`."""
        n = world * accum * batch_size
        if self.sequential is not None:
            starts = self.sequential.next_starts(n)
        else:
            starts = step_starts(len(self.train), n, self.seq_len, self.seed, step)
        for m in range(accum):
            lo = (m * world + rank) * batch_size
            yield windows(self.train, starts[lo: lo + batch_size], self.seq_len)

    def eval_batches(self, n_batches: int, batch_size: int, rank: int, world: int):
        """A fixed set of val windows (evenly spread over the split); rank r takes batches r, r+W, ..."""
        per_rank = -(-n_batches // world)
        total = per_rank * world * batch_size
        starts = np.linspace(0, len(self.val) - self.seq_len - 1, total).astype(np.int64)
        for i in range(rank, per_rank * world, world):
            yield windows(self.val, starts[i * batch_size: (i + 1) * batch_size], self.seq_len)

    def probe_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed training windows, evenly spread over the train split: the divergence guard's probe batch."""
        starts = np.linspace(0, len(self.train) - self.seq_len - 1, batch_size).astype(np.int64)
        return windows(self.train, starts, self.seq_len)

    def position(self) -> dict[str, int]:
        return self.sequential.state_dict() if self.sequential is not None else {}

    def restore(self, position: dict[str, int]) -> None:
        if self.sequential is not None and position:
            self.sequential.load_state_dict(position)


def to_device(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
