"""RMSNorm in one C++ pass each way (kernels/csrc/rms_norm_rows.h): the eager training path of a fused RMSNorm.

    forward    r = 1 / sqrt(mean(x^2) + eps)      y = x r g                 (fp32 math, y in the output dtype)
    backward   u = dy g      dx = r (u - x r^2 mean(u x))      dg = sum over rows of dy x r

The output dtype is bf16 inside a CPU bf16 autocast region for a norm whose output only matrix products read
(bf16_ok: RMSNorm.matmul_input, a block's pre-norms and the final norm), else x's: under autocast those
consumers (q / k / v, gate / up, the head) would each cast an fp32 output to bf16 anyway, and those casts plus
their gradients' casts back cost as much as the norm (torch's eager F.rms_norm is ~10 passes over the rows);
rounding once here gives the consumers the same bf16 values. A norm whose output joins the residual stream
(post-norm blocks, Gemma's output norms) keeps fp32. The one difference from autocast over an fp32 norm: the consumers'
gradients (bf16, from their bf16 products) are summed in bf16 by autograd before they reach this backward,
where autocast sums their fp32 casts (two more roundings of 2^-9 relative; tests bound both against float64).
Applies eagerly only (torch.compile traces the torch form and fuses it itself), with the kernels built, to fp32
x on the CPU. Tested against torch's F.rms_norm in tests/unit/test_fused_rms_norm.py.
"""

from __future__ import annotations

import torch

from scratchlm.kernels.build import native, native_ready

ENABLED = True  # False: every RMSNorm takes the torch form (A/B, tests)


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """bf16 inside a CPU bf16 autocast region, else x.dtype."""
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        return torch.bfloat16
    return x.dtype


def applies(x: torch.Tensor) -> bool:
    """The C++ path computes this call: eager, fp32 x on the CPU, the kernels loaded."""
    return (ENABLED and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1 and x.numel() > 0
            and not torch.compiler.is_compiling() and native_ready())


class FusedRMSNorm(torch.autograd.Function):
    """(x (..., D) fp32, g (D,) fp32, eps, bf16_out) -> y (..., D) as in the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, g: torch.Tensor, eps: float, bf16_out: bool) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (rows, D)
        g = g.detach().contiguous()
        y, rstd = native().rms_norm_rows(x2, g, eps, bf16_out)
        ctx.save_for_backward(x2, g, rstd)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, g, rstd = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape)
        if dy2.dtype not in (torch.float32, torch.bfloat16):
            dy2 = dy2.float()
        dx, dg = native().rms_norm_rows_grad(x2, g, rstd, dy2.contiguous())
        return dx.view(ctx.shape), dg, None, None


def fused_rms_norm(x: torch.Tensor, g: torch.Tensor, eps: float, bf16_ok: bool = False) -> torch.Tensor:
    """RMSNorm of x (..., D) fp32 with gain g (D,) fp32 (callers check `applies`): in `output_dtype(x)` when
    bf16_ok (only matrix products read the output), else in fp32."""
    return FusedRMSNorm.apply(x, g.float(), eps, bf16_ok and output_dtype(x) == torch.bfloat16)
