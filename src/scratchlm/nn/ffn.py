"""Position-wise feed-forward networks.

MLP (GPT-2):      FFN(x) = down(act(up(x))),                    d_ff default 4 * D
SwiGLU (Llama):   FFN(x) = down(silu(gate(x)) * up(x)),         d_ff default: 8/3 * D rounded up to a
                  multiple of `multiple_of` (keeps the parameter count of a 4*D MLP: 3 matrices of
                  D x 8D/3 = 2 matrices of D x 4D).
GLU (any gate):   FFN(x) = down(act(gate(x)) * up(x)); GeGLU (Gemma) is act = gelu_tanh.
fused=True with act = silu: the gate silu(g) * u runs as one C++ pass each way when eager on the CPU
(nn/fused_gate.py).
Shapes: x (B, T, D) -> (B, T, D); up/gate (D -> F), down (F -> D).
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.nn import fused_gate
from scratchlm.nn.activations import get_activation
from scratchlm.nn.linear import Linear


def swiglu_hidden_dim(d_model: int, multiple_of: int = 64) -> int:
    """d_ff = multiple_of * ceil((8/3 * d_model) / multiple_of)."""
    raw = (8 * d_model + 2) // 3  # ceil(8D/3) in integers
    return multiple_of * ((raw + multiple_of - 1) // multiple_of)


class MLP(nn.Module):
    """Two-layer MLP with a pointwise activation (GELU by default)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True,
                 fused: bool = False) -> None:
        super().__init__()
        self.up_proj = Linear(d_model, d_ff, bias=bias, fused=fused)
        self.down_proj = Linear(d_ff, d_model, bias=bias, fused=fused)
        self.act = get_activation(activation, fused)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))  # (B, T, D) -> (B, T, F) -> (B, T, D)


class GLU(nn.Module):
    """Gated FFN (Shazeer 2020, "GLU Variants Improve Transformer") with any gate activation."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu", bias: bool = False,
                 fused: bool = False) -> None:
        super().__init__()
        self.activation = activation
        self.fused = fused
        self.act = get_activation(activation, fused)
        self.gate_proj = Linear(d_model, d_ff, bias=bias, fused=fused)
        self.up_proj = Linear(d_model, d_ff, bias=bias, fused=fused)
        self.down_proj = Linear(d_ff, d_model, bias=bias, fused=fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj(x), self.up_proj(x)  # (B, T, F) each
        if self.fused and self.activation == "silu" and fused_gate.applies(g, u):
            return self.down_proj(fused_gate.silu_gate(g, u))
        return self.down_proj(self.act(g) * u)  # (B, T, F) gated -> (B, T, D)


class SwiGLU(GLU):
    """GLU with the SiLU gate (Llama, Qwen, Mistral...)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False, fused: bool = False) -> None:
        super().__init__(d_model, d_ff, "silu", bias, fused)
