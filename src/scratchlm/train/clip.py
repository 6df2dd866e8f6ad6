"""Gradient clipping by the global L2 norm over all parameters (torch.nn.utils.clip_grad_norm_).

    n = sqrt(sum_p ||g_p||_2^2);   g_p <- g_p * min(1, max_norm / (n + 1e-6))
Returns n (before clipping) so the caller can log it and detect inf/NaN gradients.
"""

from __future__ import annotations

from typing import Iterable

import torch


def global_grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """sqrt(sum of squared gradient entries) in fp32 over every parameter with a gradient."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    squares = [g.detach().float().square().sum() for g in grads]
    total = torch.stack([s.full_tensor() if hasattr(s, "full_tensor") else s for s in squares]).sum()
    return total.sqrt()


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """Scale gradients in place so their global norm is at most max_norm; returns the pre-clip norm."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm} (disable clipping by not calling this)")
    params = [p for p in parameters if p.grad is not None]
    norm = global_grad_norm(params)
    coef = torch.clamp(max_norm / (norm + eps), max=1.0)
    for p in params:
        p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))
    return norm
