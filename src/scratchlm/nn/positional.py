"""Absolute position embeddings added to token embeddings.

Sinusoidal ("Attention is all you need", sec. 3.5), for position p and channel pair i:
    PE[p, 2i]   = sin(p / base^(2i / D))
    PE[p, 2i+1] = cos(p / base^(2i / D)),   base = 10000
Learned: a trainable table P (max_seq_len, D), out = P[p] (GPT-2's `wpe`).

Shapes: positions (T,) or (B, T) integer -> (T, D) or (B, T, D).
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.nn.embedding import Embedding


def check_positions(positions: torch.Tensor, max_seq_len: int) -> None:
    """Raise ValueError if any position is outside [0, max_seq_len)."""
    if positions.numel() == 0 or torch.compiler.is_compiling():
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= max_seq_len:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"token position {bad} is outside the position table [0, {max_seq_len}); "
            f"shorten the input or build the model with max_seq_len > {hi}"
        )


def check_positions_shape(positions: torch.Tensor, b: int, t: int) -> None:
    """Raise ValueError unless `positions` is (T,) shared by the batch or (B, T) per row."""
    if tuple(positions.shape) not in ((t,), (b, t)):
        raise ValueError(f"positions must have shape (T,) = ({t},) or (B, T) = ({b}, {t}), "
                         f"got {tuple(positions.shape)}")


def sinusoidal_table(max_seq_len: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Return the (max_seq_len, dim) fp32 sinusoidal table; dim must be even."""
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even dim, got {dim}")
    pos = torch.arange(max_seq_len, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    angles = pos * inv_freq  # (T, D/2)
    table = torch.empty(max_seq_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position embeddings; the table is a non-persistent fp32 buffer."""

    def __init__(self, max_seq_len: int, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.register_buffer("table", sinusoidal_table(max_seq_len, dim, base), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        check_positions(positions, self.max_seq_len)
        return self.table[positions]


class LearnedPositions(Embedding):
    """Learned absolute position embeddings: a (max_seq_len, D) table indexed by position."""

    def __init__(self, max_seq_len: int, dim: int) -> None:
        super().__init__(max_seq_len, dim)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        check_positions(positions, self.num_embeddings)
        return self.weight[positions]
