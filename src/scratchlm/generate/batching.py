"""Left padding of prompts of different lengths into one (B, P) batch.

Row b with n_b tokens is placed at slots P - n_b .. P - 1 (pads on the left), so every row's next
token lands in the same slot P and one decode step serves the whole batch. Each row keeps its own
RoPE / learned positions: position = number of real tokens before it, i.e.
    positions[b, t] = max(cumsum(valid[b])[t] - 1, 0)
so a padded row sees exactly the positions it would see alone; pads are hidden from attention by the
key mask (B, S), True = real token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PaddedBatch:
    ids: torch.Tensor  # (B, P) int64, pads = pad_id
    valid: torch.Tensor  # (B, P) bool, True = real token
    positions: torch.Tensor  # (B, P) int64 position of each slot within its row
    lengths: torch.Tensor  # (B,) int64 number of real tokens per row

    @property
    def has_padding(self) -> bool:
        return not bool(self.valid.all())


def check_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    """Raise ValueError for an empty batch, an empty prompt or an id outside [0, vocab_size)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists, e.g. [[1, 2, 3]]")
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__len__"):
            raise ValueError(f"prompt {i} must be a list of token ids, got {type(p).__name__}; encode text first")
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. a BOS/EOS id)")
        bad = [t for t in p if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token id {bad[0]!r} outside the vocabulary [0, {vocab_size})")


def left_pad(prompts: list[list[int]], pad_id: int = 0, device: torch.device | str = "cpu") -> PaddedBatch:
    """Stack prompts into a left-padded (B, P) batch with its key mask and per-row positions."""
    b, p = len(prompts), max(len(x) for x in prompts)
    ids = torch.full((b, p), pad_id, dtype=torch.long)
    valid = torch.zeros((b, p), dtype=torch.bool)
    for row, tokens in enumerate(prompts):
        ids[row, p - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
        valid[row, p - len(tokens):] = True
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, P)
    lengths = valid.sum(dim=1)
    return PaddedBatch(ids.to(device), valid.to(device), positions.to(device), lengths.to(device))
