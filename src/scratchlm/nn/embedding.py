"""Token embedding: a lookup table, out[b, t] = W[ids[b, t]].

Shapes: ids (B, T) integer -> (B, T, D); W (V, D) [firm layout, as torch.nn.Embedding].
Init: W ~ N(0, 1) like torch.nn.Embedding (the LM re-initialises with N(0, 0.02)).
"""

from __future__ import annotations

import torch
from torch import nn


def check_token_ids(ids: torch.Tensor, vocab_size: int, name: str = "token ids") -> None:
    """Raise ValueError unless `ids` is an integer tensor with every value in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of integer ids, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype (e.g. torch.long), got {ids.dtype}")
    if ids.numel() == 0 or torch.compiler.is_compiling():
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        raise ValueError(f"{name} contain negative id {lo}; valid ids are 0..{vocab_size - 1}")
    if hi >= vocab_size:
        raise ValueError(
            f"{name} contain id {hi} >= vocab_size {vocab_size}; valid ids are 0..{vocab_size - 1} "
            "(was the data encoded with a different tokenizer?)"
        )


class Embedding(nn.Module):
    """From-scratch embedding table with id validation (clear errors instead of an index crash)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(
                f"Embedding needs positive sizes, got num_embeddings={num_embeddings}, "
                f"embedding_dim={embedding_dim}"
            )
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        if not self.weight.is_meta:  # a model built on the meta device gets its weights from a loader
            nn.init.normal_(self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.num_embeddings)
        # index_select, not weight[ids]: its backward is index_add_, which sums the rows of repeated ids in
        # a fixed order with any number of threads; weight[ids]'s backward (index_put_ with accumulate) is
        # not deterministic on a multi-threaded CPU, which made two identical 2-thread training runs differ
        rows = torch.index_select(self.weight, 0, ids.reshape(-1))  # (N, D), N = ids.numel()
        return rows.view(*ids.shape, self.embedding_dim)  # (..., ) -> (..., D)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
