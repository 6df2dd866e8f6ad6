"""RoPE's fused form in one C++ pass each way (kernels/csrc/rope_rows.h): the eager path of RotaryEmbedding.

    forward    y = x cos + rot(x) sin        backward    dx = dy cos - rot(dy) sin

with the full-width tables of the style (nn/rope.py) and rot(a, b) = (-b, a) on each pair. x (B, H, T, Hd) fp32 or
bf16, usually the transposed view of a projection's (B, T, H, Hd) output: y comes out contiguous (B, H, T, Hd) (the
attention reads it without a copy) and dx in x's own layout (the projection's backward reads it without one).
Math in fp32, one rounding to x's dtype, as torch's fused form (x.float(), addcmul, .to(dtype)) does.
Applies eagerly only (torch.compile fuses the torch form), with the kernels built, on the CPU, Hd <= 1024.
Tested against the torch form and float64 in tests/unit/test_fused_rope.py.
"""

from __future__ import annotations

import torch

from scratchlm.kernels.build import native, native_ready

ENABLED = True  # False: RoPE takes the torch form (A/B, tests)


def applies(x: torch.Tensor) -> bool:
    """The C++ path rotates x: eager, CPU, fp32 or bf16, (B, H, T, Hd) with a contiguous last dim."""
    return (ENABLED and x.dim() == 4 and x.dtype in (torch.float32, torch.bfloat16) and x.device.type == "cpu"
            and x.numel() > 0 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0 and x.shape[-1] <= 1024
            and not torch.compiler.is_compiling() and native_ready())


class FusedRope(torch.autograd.Function):
    """(x (B, H, T, Hd), cos, sin (T | B T, Hd) fp32, half) -> the rotated x, contiguous."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool) -> torch.Tensor:
        cos, sin = cos.contiguous(), sin.contiguous()
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        native().rope_rows_(x, y, cos, sin, half, 1.0)
        ctx.save_for_backward(cos, sin)
        ctx.half = half
        # dx in x's layout (a projection's transposed view stays one), allocated when the backward runs
        ctx.layout = (x.shape, torch.empty_like(x, device="meta").stride(), x.dtype, x.device)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        cos, sin = ctx.saved_tensors
        shape, stride, dtype, device = ctx.layout
        dx = torch.empty_strided(shape, stride, dtype=dtype, device=device)  # empty_like's strides
        if dy.stride(-1) != 1:
            dy = dy.contiguous()
        native().rope_rows_(dy.to(dx.dtype), dx, cos, sin, ctx.half, -1.0)
        return dx, None, None, None


def fused_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """RoPE of x (B, H, T, Hd) with full-width tables cos, sin (T, Hd) or (B, T, Hd) (callers check `applies`)."""
    return FusedRope.apply(x, cos.float(), sin.float(), style == "half")
