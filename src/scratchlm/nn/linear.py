"""Linear layer: y = x @ W.T + b.

Shapes: x (..., in_features) -> y (..., out_features); W (out_features, in_features) [firm layout,
as torch.nn.Linear], b (out_features,).

Init (same as torch.nn.Linear): W, b ~ U(-1/sqrt(in_features), 1/sqrt(in_features)).
fused=True (ModelConfig.ops_impl="fused"): fp32 products on CPU through oneDNN (nn/onednn_linear.py), the same
function up to fp32 summation order; other dtypes and devices keep the reference product.
`TransformerLM.init_weights` re-initialises the model's linears with N(0, 0.02) (GPT-2 / Llama style).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from scratchlm.nn import onednn_linear


class Linear(nn.Module):
    """From-scratch affine map y = x W^T + b with W stored (out, in)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, fused: bool = False) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(
                f"Linear needs positive sizes, got in_features={in_features}, out_features={out_features}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.fused = fused
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        if not self.weight.is_meta:  # a model built on the meta device gets its weights from a loader
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """W, b ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return onednn_linear.linear(x, self.weight, self.bias)
        return onednn_linear.reference_linear(x, self.weight, self.bias)  # x @ W.T + b

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
                + (", fused" if self.fused else ""))
