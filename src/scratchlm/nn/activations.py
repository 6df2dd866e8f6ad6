"""Activation functions (elementwise; any shape in, same shape out).

relu(x)      = max(x, 0)
sigmoid(x)   = 1 / (1 + e^-x), evaluated as z = e^-|x|: x>=0 -> 1/(1+z), x<0 -> z/(1+z) (never overflows)
silu(x)      = x * sigmoid(x)                                    (a.k.a. swish, beta = 1)
gelu(x)      = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))           ("none" approximation, exact)
gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (GPT-2's "gelu_new")
"""

from __future__ import annotations

import math
from typing import Callable

import torch


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


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Look up an activation by exact name; the error lists the valid names."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; valid: {sorted(ACTIVATIONS)}") from None
