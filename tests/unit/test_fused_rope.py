"""nn/fused_rope.py: RoPE's fused form in one C++ pass each way (kernels/csrc/rope_rows.h), through RotaryEmbedding.

Reference built from torch ops here: the rotation written out in float64 (pairs (x[i], x[i + Hd/2]) or (x[2i],
x[2i + 1]) rotated by p * base^(-2i/d)), values and gradients through torch autograd.
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.nn import fused_rope as fro
from scratchlm.nn.rope import RotaryEmbedding


def float64_rope(x: torch.Tensor, pos: torch.Tensor, d: int, base: float, style: str) -> torch.Tensor:
    """x (B, H, T, Hd) float64; the first d dims rotate at positions pos (T,) or (B, T)."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    ang = pos.double()[..., None] * inv  # (T, d/2) or (B, T, d/2)
    if pos.dim() == 2:
        ang = ang[:, None]
    cos, sin = torch.cos(ang), torch.sin(ang)
    r = x[..., :d]
    a, b = (r[..., : d // 2], r[..., d // 2:]) if style == "half" else (r[..., 0::2], r[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    rot = torch.cat((ra, rb), -1) if style == "half" else torch.stack((ra, rb), -1).flatten(-2)
    return torch.cat((rot, x[..., d:]), -1)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_batch", [False, True])
def test_rope_matches_float64(kernels, style: str, dtype: torch.dtype, per_batch: bool) -> None:
    g = torch.Generator().manual_seed(3)
    b, t, h, hd = 2, 19, 3, 64
    proj = torch.randn(b, t, h, hd, generator=g).to(dtype)  # a projection's output, split into heads
    pos = torch.randint(0, 500, (b, t), generator=g) if per_batch else torch.arange(7, 7 + t)
    rope = RotaryEmbedding(hd, 512, base=10000.0, style=style, fused=True)
    x = proj.clone().requires_grad_()
    xt = x.transpose(1, 2)  # (B, H, T, Hd), as Attention.project_qkv passes it
    assert fro.applies(xt)
    y = rope(xt, pos)
    dy = torch.randn(y.shape, generator=g).to(dtype)
    y.backward(dy)
    x64 = proj.double().requires_grad_()
    want = float64_rope(x64.transpose(1, 2), pos, hd, 10000.0, style)
    want.backward(dy.double())
    fro.ENABLED = False  # torch's fused form with the same fp32 tables (their angles p theta lose ~p ulp)
    try:
        xr = proj.clone().requires_grad_()
        y_torch = rope(xr.transpose(1, 2), pos)
        y_torch.backward(dy)
    finally:
        fro.ENABLED = True
    assert y.dtype == dtype and y.is_contiguous()  # what the attention reads without a copy
    assert x.grad.is_contiguous()  # dx in the projection's layout
    tol = 2e-6 if dtype == torch.float32 else 2.0 ** -8
    for got, peer, ref in ((y, y_torch, want.detach()), (x.grad, xr.grad, x64.grad)):
        err = float((got.double() - ref).abs().max())
        assert err <= float((peer.double() - ref).abs().max()) + tol * float(ref.abs().max())


def test_partial_rotary_and_switch(kernels) -> None:
    """Phi-4-mini's partial rotary (the first 32 of 64 dims): the C++ path takes the strided slice; the torch
    form (switch off) gives the same values."""
    g = torch.Generator().manual_seed(5)
    rope = RotaryEmbedding(32, 128, style="half", fused=True)
    proj = torch.randn(1, 11, 2, 64, generator=g)
    pos = torch.arange(11)
    outs = []
    for enabled in (True, False):
        fro.ENABLED = enabled
        try:
            x = proj.clone().requires_grad_()
            y = rope(x.transpose(1, 2), pos)
            y.backward(torch.ones_like(y))
        finally:
            fro.ENABLED = True
        outs.append((y.detach(), x.grad))
    want = float64_rope(proj.double().transpose(1, 2), pos, 32, 10000.0, "half")
    assert float((outs[0][0].double() - want).abs().max()) < 2e-6 * float(want.abs().max())
    assert torch.allclose(outs[0][0], outs[1][0], rtol=1e-6, atol=1e-6)
    assert torch.allclose(outs[0][1], outs[1][1], rtol=1e-6, atol=1e-6)


def test_not_applied_where_it_does_not_hold(kernels) -> None:
    assert not fro.applies(torch.randn(2, 3, 4, 8, dtype=torch.float64))
    assert not fro.applies(torch.randn(2, 3, 4, 8).transpose(-1, -2))  # last dim not contiguous
    assert not fro.applies(torch.randn(3, 4, 8))
    assert not fro.applies(torch.randn(2, 3, 4, 7))
