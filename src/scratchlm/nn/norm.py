"""Normalisation layers: RMSNorm, LayerNorm, BatchNorm1d.

RMSNorm:    y = x / sqrt(mean(x^2) + eps) * g                  (no mean-centering)
            unit_offset (Gemma): y = x / sqrt(mean(x^2) + eps) * (1 + w), w initialised to 0
LayerNorm:  y = (x - mean(x)) / sqrt(var(x) + eps) * g + b     (biased variance: divide by N, not N-1)
BatchNorm1d (training): per channel c over batch (and length) dims,
            y = (x - mu_B) / sqrt(var_B + eps) * g + b, var_B biased;
            running_mean <- (1 - m) running_mean + m mu_B;  running_var <- (1 - m) running_var + m var_B_unbiased
            (eval): the running statistics replace the batch ones.
RMSNorm and LayerNorm compute in fp32 and cast the result back to the input dtype (bf16-safe).
fused=True (ModelConfig.ops_impl="fused") computes the same through torch's fused F.rms_norm /
F.layer_norm kernels (one op instead of five; equality tested in tests/unit/test_fused_ops.py); an eager fp32
RMSNorm on the CPU runs as one C++ pass each way instead (nn/fused_rms_norm.py), its output in bf16 under bf16
autocast when the norm is marked `matmul_input` (only matrix products read it, which would cast it to bf16
anyway: a block's pre-norms, the final norm; never a norm whose output joins the residual stream).
Shapes: RMSNorm/LayerNorm normalise the last dim D; BatchNorm1d takes (B, C) or (B, C, L).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scratchlm.nn import fused_rms_norm as fused_rms


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), as in Llama; math in fp32, result cast back.

    unit_offset=True stores the gain as g = 1 + w (Gemma): w starts at 0, so weight decay pulls the gain
    towards 1, not 0."""

    def __init__(self, dim: int, eps: float = 1e-6, fused: bool = False, unit_offset: bool = False,
                 matmul_input: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.fused = fused
        self.unit_offset = unit_offset
        self.matmul_input = matmul_input  # only matrix products read the output (see the module docstring)
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def gain(self) -> torch.Tensor:
        """The multiplier g (dim,) in fp32: weight, or 1 + weight with unit_offset."""
        return 1.0 + self.weight.float() if self.unit_offset else self.weight.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and fused_rms.applies(x):
            return fused_rms.fused_rms_norm(x, self.gain(), self.eps, bf16_ok=self.matmul_input)
        x32 = x.float()
        if self.fused:
            return F.rms_norm(x32, (self.dim,), self.gain(), self.eps).to(x.dtype)
        ms = (x32 * x32).mean(dim=-1, keepdim=True)  # (..., 1)
        return (x32 * torch.rsqrt(ms + self.eps) * self.gain()).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"{self.dim}, eps={self.eps}" + (", fused" if self.fused else "")
                + (", unit_offset" if self.unit_offset else ""))


class LayerNorm(nn.Module):
    """Layer norm (Ba et al. 2016) over the last dim with biased variance and optional bias."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, fused: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        if self.fused:
            bias = None if self.bias is None else self.bias.float()
            return F.layer_norm(x32, (self.dim,), self.weight.float(), bias, self.eps).to(x.dtype)
        mean = x32.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = x32 - mean
        var = (centred * centred).mean(dim=-1, keepdim=True)  # biased: / D
        y = centred * torch.rsqrt(var + self.eps) * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"


class BatchNorm1d(nn.Module):
    """Batch norm (Ioffe & Szegedy 2015) over (B, C) or (B, C, L) inputs with running statistics."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BatchNorm1d momentum must be in [0, 1], got {momentum}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() not in (2, 3) or x.shape[1] != self.num_features:
            raise ValueError(
                f"BatchNorm1d expects (B, {self.num_features}) or (B, {self.num_features}, L), "
                f"got shape {tuple(x.shape)}"
            )
        dims = (0,) if x.dim() == 2 else (0, 2)
        shape = (1, -1) if x.dim() == 2 else (1, -1, 1)  # broadcast per-channel stats
        if self.training:
            n = x.numel() // self.num_features
            if n < 2:
                raise ValueError(
                    f"BatchNorm1d in training needs more than 1 value per channel, got input {tuple(x.shape)}"
                )
            mean = x.mean(dim=dims)  # (C,)
            var = ((x - mean.view(shape)) ** 2).mean(dim=dims)  # biased, used to normalise
            with torch.no_grad():
                m = self.momentum
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * n / (n - 1))  # unbiased
                self.num_batches_tracked.add_(1)
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        return y * self.weight.view(shape) + self.bias.view(shape)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"
