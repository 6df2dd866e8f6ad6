"""`GGMLBlocks`: one weight matrix kept in a ggml block format, row by row, exactly as a GGUF file stores it.

A ggml quantized row of `cols` values is `cols / block_size` blocks laid end to end (block_size 32 for
Q8_0/Q4_0/Q4_1, 256 for the K-quants), so rows are independent: permuting or slicing rows of `data`
permutes or slices the dequantized matrix the same way. Loaders attach these to a model as
`model.quantized_weights: dict[str, GGMLBlocks]` keyed by the HF-style parameter name
(e.g. "model.layers.0.self_attn.q_proj.weight"), already in scratchlm's row order, so decode kernels can
run on the file's own blocks (exactly the quantized model) instead of re-quantizing fp32 weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scratchlm.quant.ggml_types import ggml_type



@dataclass(frozen=True)
class GGMLBlocks:
    """A (rows, cols) matrix as raw ggml blocks: `data` is uint8 (rows, bytes_per_row), C-contiguous."""

    ggml_type: str
    data: torch.Tensor
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        ggml_type(self.ggml_type)  # ValueError naming the supported types
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or self.data.shape[0] != self.shape[0]:
            raise ValueError(f"GGMLBlocks.data must be uint8 (rows={self.shape[0]}, bytes_per_row), "
                             f"got {self.data.dtype} {tuple(self.data.shape)}")
