"""A token embedding whose table stays in ggml blocks: out[b, t] = dequantize(W[ids[b, t]]).

Rows of a ggml matrix are independent runs of blocks, so a lookup gathers the rows' bytes and
dequantizes only those (N rows, not V). Shapes: ids (...) integer -> (..., D) fp32; W (V, D) [firm layout,
as Embedding.weight]. The same blocks serve a tied LM head (BlockLinear over this table).
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.nn.embedding import check_token_ids
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import dequantize


class BlockEmbedding(nn.Module):
    """Embedding lookup on a ggml block table (module docstring)."""

    def __init__(self, blocks: GGMLBlocks) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = blocks.shape
        self.ggml_type = blocks.ggml_type
        self.register_buffer("data", blocks.data, persistent=False)  # uint8 (V, row_bytes)

    @property
    def blocks(self) -> GGMLBlocks:
        return GGMLBlocks(self.ggml_type, self.data, (self.num_embeddings, self.embedding_dim))

    @property
    def weight(self) -> torch.Tensor:
        """The whole table dequantized to fp32 (V, D): a fresh tensor, for code that needs it once."""
        return dequantize(self.data, self.ggml_type, (self.num_embeddings, self.embedding_dim))

    def dense_weights(self) -> dict[str, torch.Tensor]:
        """{"weight": the table dequantized}: what a dense Embedding holds (nn/block_state.py)."""
        return {"weight": self.weight}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.num_embeddings)
        rows = torch.index_select(self.data, 0, ids.reshape(-1))  # (N, row_bytes) uint8
        values = dequantize(rows, self.ggml_type, (rows.shape[0], self.embedding_dim))  # (N, D) fp32
        return values.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.ggml_type}"
