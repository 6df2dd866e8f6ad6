"""nn/fused_gate.py: the SwiGLU gate silu(a) * b in one C++ pass each way (kernels/csrc/silu_gate.h).

References built from torch ops here: F.silu(a) * b in float64 on the same (fp32 or bf16) inputs, values and
gradients through torch autograd; torch's own bf16 form as the peer whose error ours must stay within.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import fused_gate as fg
from scratchlm.nn.ffn import SwiGLU


def float64_gate(a: torch.Tensor, b: torch.Tensor, dh: torch.Tensor):
    a, b = a.double().requires_grad_(), b.double().requires_grad_()
    h = F.silu(a) * b
    h.backward(dh.double())
    return h.detach(), a.grad, b.grad


def gate(a: torch.Tensor, b: torch.Tensor, dh: torch.Tensor, fused: bool):
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    h = fg.silu_gate(a, b) if fused else F.silu(a) * b
    h.backward(dh)
    return h.detach(), a.grad, b.grad


@pytest.mark.parametrize("n", [1, 15, 16, 255, 257, 3 * 1024 + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_matches_float64(kernels, n: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(n)
    a = (torch.randn(3, n, generator=g) * 4).to(dtype)
    b = torch.randn(3, n, generator=g).to(dtype)
    dh = torch.randn(3, n, generator=g).to(dtype)
    assert fg.applies(a, b)
    got = gate(a, b, dh, fused=True)
    want = float64_gate(a, b, dh)
    torch_form = gate(a, b, dh, fused=False)
    for x, w, t in zip(got, want, torch_form):
        assert x.dtype == dtype
        err = (x.double() - w).abs()
        if dtype == torch.float32:
            assert float(err.max()) <= 1e-6 * float(w.abs().max())
        else:  # one rounding of the fp32 result: within a bf16 step, and no further off than torch's bf16 ops
            assert bool((err <= 2.0 ** -8 * w.abs() + 1e-30).all())
            assert float(err.max()) <= float((t.double() - w).abs().max()) + 1e-30


def test_gate_saturates_without_nan(kernels) -> None:
    a = torch.tensor([-200.0, -100.0, -90.0, 0.0, 90.0, 200.0] * 3)
    b = torch.full_like(a, 2.0)
    h, da, db = gate(a, b, torch.ones_like(a), fused=True)
    want = float64_gate(a, b, torch.ones_like(a))
    for x, w in zip((h, da, db), want):
        assert bool(torch.isfinite(x).all())
        assert torch.allclose(x.double(), w, rtol=1e-6, atol=1e-30)


def test_swiglu_module_uses_it_under_autocast(kernels) -> None:
    torch.manual_seed(0)
    ffn = SwiGLU(32, 96, fused=True)
    x = torch.randn(2, 5, 32, requires_grad=True)
    outs = []
    for enabled in (True, False):
        fg.ENABLED = enabled
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = ffn(x)
            y.float().sum().backward()
        finally:
            fg.ENABLED = True
        outs.append((y.detach().float(), x.grad.clone(), ffn.gate_proj.weight.grad.clone()))
        x.grad, ffn.gate_proj.weight.grad, ffn.up_proj.weight.grad, ffn.down_proj.weight.grad = None, None, None, None
    (y1, dx1, dw1), (y2, dx2, dw2) = outs
    # the two differ only in the gate's bf16 roundings (one vs two): a few bf16 steps after the down projection
    assert torch.allclose(y1, y2, rtol=0.05, atol=0.02 * float(y2.abs().max()))
    assert torch.allclose(dx1, dx2, rtol=0.05, atol=0.02 * float(dx2.abs().max()))
    assert torch.allclose(dw1, dw2, rtol=0.05, atol=0.02 * float(dw2.abs().max()))


def test_not_applied_where_it_does_not_hold(kernels) -> None:
    a = torch.randn(4, 8)
    assert not fg.applies(a, torch.randn(4, 8).to(torch.bfloat16))
    assert not fg.applies(a, torch.randn(4, 9))
    assert not fg.applies(a.double(), a.double())
    assert not fg.applies(torch.randn(0, 8), torch.randn(0, 8))
