"""The SwiGLU gate h = silu(a) b in one C++ pass each way (kernels/csrc/silu_gate.h): GLU's eager fast path.

    forward    h = a s b,   s = sigmoid(a)
    backward   da = dh b s (1 + a (1 - s))      db = dh a s

a (the gate projection) and b (the up projection) share one dtype, fp32 or bf16 (their products under bf16
autocast); the math is fp32 and each output rounds once to that dtype, where torch's eager silu and multiply
round silu(a) first (and dh b before silu's backward): within a bf16 step of torch's result, and closer to the
exact function (tests/unit/test_fused_gate.py checks both against float64). Applies eagerly only (torch.compile
fuses the torch form itself), with the kernels built, on the CPU.
"""

from __future__ import annotations

import torch

from scratchlm.kernels.build import native, native_ready

ENABLED = True  # False: every gate takes the torch form (A/B, tests)


def applies(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The C++ path computes silu(a) * b: eager, CPU, one shape and one dtype (fp32 or bf16), kernels loaded."""
    return (ENABLED and a.shape == b.shape and a.dtype == b.dtype and a.dtype in (torch.float32, torch.bfloat16)
            and a.device.type == "cpu" and b.device.type == "cpu" and a.numel() > 0
            and not torch.compiler.is_compiling() and native_ready())


class SiluGate(torch.autograd.Function):
    """(a, b) -> silu(a) b as in the module docstring."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return native().silu_gate(a, b)

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        a, b = ctx.saved_tensors
        return native().silu_gate_grad(a, b, dh.to(a.dtype).contiguous())


def silu_gate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b (callers check `applies`)."""
    return SiluGate.apply(a, b)
