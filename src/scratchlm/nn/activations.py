"""Activation functions (elementwise; any shape in, same shape out).

relu(x)      = max(x, 0)
sigmoid(x)   = 1 / (1 + e^-x), evaluated as z = e^-|x|: x>=0 -> 1/(1+z), x<0 -> z/(1+z) (never overflows)
silu(x)      = x * sigmoid(x)                                    (a.k.a. swish, beta = 1)
gelu(x)      = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))           ("none" approximation, exact)
gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (GPT-2's "gelu_new")

TORCH_ACTIVATIONS: the same functions as torch's fused kernels (F.silu, F.gelu, ...), the fast path
chosen by `get_activation(name, fused=True)`; equality tested in tests/unit/test_fused_ops.py.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def relu(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, torch.zeros_like(x))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    z = torch.exp(-x.abs())
    return torch.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * sigmoid(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": relu,
    "sigmoid": sigmoid,
    "silu": silu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
}


TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def get_activation(name: str, fused: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """Look up an activation by exact name (ours, or torch's kernel when fused); the error lists the valid names."""
    try:
        return (TORCH_ACTIVATIONS if fused else ACTIVATIONS)[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; valid: {sorted(ACTIVATIONS)}") from None
