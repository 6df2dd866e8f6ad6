"""AdamW from scratch (Loshchilov & Hutter: decoupled weight decay) and parameter groups.

Per parameter p with gradient g at step t (1-based), lr a, betas (b1, b2), decay wd:
    p   <- p * (1 - a * wd)                       decoupled decay (not added to g)
    m   <- b1 * m + (1 - b1) * g                  first moment
    v   <- b2 * v + (1 - b2) * g^2                second moment
    m^  = m / (1 - b1^t);  v^ = v / (1 - b2^t)    bias correction
    p   <- p - a * m^ / (sqrt(v^) + eps)
This is torch.optim.AdamW (amsgrad=False, maximize=False) operation for operation; `impl="torch"`
builds torch's fused (or foreach) AdamW instead as the fast path, tested equal.

Parameter groups: weight decay applies only to matrices that multiply activations (attention and
FFN projections, an untied LM head). Norm gains, biases (every 1-D tensor) and embeddings (token
and learned position tables, hence a tied LM head too) are not decayed: shrinking a gain or a bias
toward 0 is not a useful prior, and decaying rare tokens' embeddings erases them.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

OPTIMIZER_IMPLS = ("reference", "torch")


class AdamW(torch.optim.Optimizer):
    """AdamW with the update in the module docstring; state per parameter: step, exp_avg, exp_avg_sq."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        if not lr >= 0:
            raise ValueError(f"AdamW lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"AdamW betas must be in [0, 1), got {betas}")
        if not eps > 0:
            raise ValueError(f"AdamW eps must be > 0, got {eps}")
        if not weight_decay >= 0:
            raise ValueError(f"AdamW weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - formula in the module docstring
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self._update(p, p.grad, state, lr, b1, b2, eps, wd)
        return loss

    @staticmethod
    def _update(p, g, state, lr: float, b1: float, b2: float, eps: float, wd: float) -> None:
        state["step"] += 1
        t = state["step"].item()
        m, v = state["exp_avg"], state["exp_avg_sq"]
        p.mul_(1.0 - lr * wd)
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        step_size = lr / (1.0 - b1**t)
        denom = (v.sqrt() / math.sqrt(1.0 - b2**t)).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: {decayed matrices, weight_decay} and {norms/biases/embeddings, 0.0} (see docstring).

    Each group also carries "names" (parameter names, shared tensors once) for checkpoints and logs.
    """
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():  # a tied LM head shares embed_tokens.weight: listed once
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or "embed" in name else decay).append((name, p))
    groups = [
        {"params": [p for _, p in decay], "names": [n for n, _ in decay], "weight_decay": weight_decay},
        {"params": [p for _, p in no_decay], "names": [n for n, _ in no_decay], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    impl: str = "reference",
) -> torch.optim.Optimizer:
    """AdamW over `param_groups(model)`: our reference, or torch's fused/foreach fast path."""
    groups = param_groups(model, weight_decay)
    if impl == "reference":
        return AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if impl == "torch":
        params = [p for g in groups for p in g["params"]]
        fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16) for p in params)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                 fused=fused, foreach=None if fused else True)
    raise ValueError(f"optimizer impl={impl!r} is not one of {OPTIMIZER_IMPLS}")
