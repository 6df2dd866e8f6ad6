"""Mixture-of-experts FFNs whose weights stay in ggml blocks (a GGUF file's 3-D expert tensors, no copy).

The same E gated FFNs as nn/moe.py's Experts, Expert_e(x) = down_e(act(gate_e x) * up_e x), and the same
interface (expert, dense, grouped), but gate_proj / up_proj (E, F, D) and down_proj (E, D, F) are ggml blocks:
a GGUF expert tensor is E matrices stacked by rows, each row its own run of blocks, so expert e's matrix is
rows [e F, (e + 1) F) of the stacked rows — a BlockLinear (nn/block_linear.py) over that slice.
Shapes: x (n, D) -> (n, D); combine (N, E); weights / idx (N, k).
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.nn.activations import get_activation
from scratchlm.nn.block_linear import BlockLinear
from scratchlm.quant.blocks import GGMLBlocks


def expert_blocks(ggml_type: str, rows: torch.Tensor, shape: tuple[int, int, int]) -> list[GGMLBlocks]:
    """A stacked (E, out, in) expert tensor's raw rows (E out, row_bytes) -> one GGMLBlocks per expert."""
    n_experts, out_features, in_features = shape
    if rows.shape[0] != n_experts * out_features:
        raise ValueError(f"expert rows {tuple(rows.shape)} do not hold {n_experts} experts of {out_features} rows")
    return [GGMLBlocks(ggml_type, rows[e * out_features:(e + 1) * out_features], (out_features, in_features))
            for e in range(n_experts)]


class BlockExperts(nn.Module):
    """E gated FFNs on ggml blocks: gate_proj[e], up_proj[e] (F, D), down_proj[e] (D, F) are BlockLinears."""

    def __init__(self, gate: list[GGMLBlocks], up: list[GGMLBlocks], down: list[GGMLBlocks],
                 activation: str = "silu", fused: bool = False) -> None:
        super().__init__()
        if not len(gate) == len(up) == len(down) > 0:
            raise ValueError(f"BlockExperts needs as many gate, up and down matrices, got {len(gate)}, {len(up)}, "
                             f"{len(down)}")
        self.n_experts = len(gate)
        self.gate_proj = nn.ModuleList(BlockLinear(b) for b in gate)
        self.up_proj = nn.ModuleList(BlockLinear(b) for b in up)
        self.down_proj = nn.ModuleList(BlockLinear(b) for b in down)
        self.act = get_activation(activation, fused)

    def stacked(self, name: str) -> GGMLBlocks | None:
        """The experts' `name` matrices ("gate_proj", "up_proj", "down_proj") as one (E rows, in) GGMLBlocks over
        their own bytes when they are consecutive rows of one tensor (as expert_blocks cuts a GGUF's expert
        tensor), else None: kernels/ops.repack_stack repacks that once for all experts."""
        lins = getattr(self, name)
        first = lins[0].data
        row_bytes, rows = first.shape[1], lins[0].out_features
        consecutive = all(
            lin.data.is_contiguous() and lin.data.shape == first.shape and lin.ggml_type == lins[0].ggml_type
            and lin.data.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            and lin.data.data_ptr() == first.data_ptr() + e * rows * row_bytes for e, lin in enumerate(lins))
        if not (consecutive and first.is_contiguous()):
            return None
        view = first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (len(lins) * rows, row_bytes))
        return GGMLBlocks(lins[0].ggml_type, view, (len(lins) * rows, lins[0].in_features))

    def dense_weights(self) -> dict[str, torch.Tensor]:
        """The stacked (E, F, D) / (E, D, F) matrices a dense Experts holds (nn/block_state.py)."""
        return {name: torch.stack([lin.weight for lin in getattr(self, name)])
                for name in ("gate_proj", "up_proj", "down_proj")}

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x (n, D) -> (n, D)."""
        return self.down_proj[e](self.act(self.gate_proj[e](x)) * self.up_proj[e](x))  # (n, F) gated -> (n, D)

    def dense(self, x: torch.Tensor, combine: torch.Tensor) -> torch.Tensor:
        """Reference: sum_e combine[:, e] * Expert_e(x) over every expert; x (N, D), combine (N, E)."""
        out = torch.zeros_like(x)
        for e in range(self.n_experts):
            out = out + combine[:, e:e + 1].to(x.dtype) * self.expert(e, x)
        return out

    def grouped(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Each expert on exactly its routed rows; x (N, D), weights / idx (N, k)."""
        flat = idx.flatten()  # (N k,) expert of each (token, slot)
        out = torch.zeros_like(x)
        for e in flat.unique().tolist():
            pairs = (flat == e).nonzero().flatten()  # flat (token, slot) positions routed to expert e
            token = pairs // idx.shape[1]
            y = self.expert(e, x[token]) * weights.flatten()[pairs, None].to(x.dtype)
            out.index_add_(0, token, y)
        return out

    def extra_repr(self) -> str:
        b = self.gate_proj[0]
        return f"{self.n_experts} experts, d_model={b.in_features}, d_ff={b.out_features}, {b.ggml_type}"
