"""nn/fused_rms_norm.py: the eager C++ RMSNorm (kernels/csrc/rms_norm_rows.h) and RMSNorm's use of it.

References built from torch ops here: torch's F.rms_norm in float64 (values and gradients through autograd) and
in fp32, rounded by .to(bfloat16) where our output is bf16 (what a bf16 autocast Linear makes of the fp32 norm).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import fused_rms_norm as fr
from scratchlm.nn.norm import RMSNorm


def float64_norm(x: torch.Tensor, g: torch.Tensor, dy: torch.Tensor, eps: float):
    """y, dx, dg of F.rms_norm in float64 (torch autograd)."""
    x = x.double().requires_grad_()
    g = g.double().requires_grad_()
    y = F.rms_norm(x, (x.shape[-1],), g, eps)
    y.backward(dy.double())
    return y.detach(), x.grad, g.grad


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("shape", [(2, 5, 384), (3, 7), (1, 1, 100), (37, 1000)])
@pytest.mark.parametrize("bf16", [False, True])
def test_fused_norm_matches_float64(kernels, shape, bf16: bool) -> None:
    g_ = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g_) * 3
    g = torch.randn(shape[-1], generator=g_)
    dy = torch.randn(*shape, generator=g_).to(torch.bfloat16 if bf16 else torch.float32)
    want_y, want_dx, want_dg = float64_norm(x, g, dy, 1e-6)
    xr, gr = x.clone().requires_grad_(), g.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        assert fr.applies(xr)
        y = fr.fused_rms_norm(xr, gr, 1e-6, bf16_ok=True)
    assert y.dtype == (torch.bfloat16 if bf16 else torch.float32) and y.shape == x.shape
    y.backward(dy)
    # torch's own fp32 F.rms_norm lands ~1.2e-7 from float64 on these; the fp32 parts of ours stay within 1e-6
    assert rel(xr.grad, want_dx) < 1e-6
    assert rel(gr.grad, want_dg) < 1e-6
    if not bf16:
        assert rel(y, want_y) < 1e-6
    else:  # the fp32 norm rounded once to bf16: at most one bf16 step from torch's fp32 result rounded
        torch_bf16 = F.rms_norm(x, (shape[-1],), g, 1e-6).to(torch.bfloat16).float()
        ulp = torch.finfo(torch.bfloat16).eps * torch_bf16.abs().clamp_min(1e-30)
        steps = (y.float() - torch_bf16).abs() / ulp
        assert float(steps.max()) <= 1.0 and float((steps == 0).float().mean()) > 0.99


def test_weight_gradient_same_bits_for_any_thread_count(kernels) -> None:
    x = torch.randn(301, 96, generator=torch.Generator().manual_seed(1))
    g = torch.randn(96, generator=torch.Generator().manual_seed(2))
    dy = torch.randn(301, 96, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    grads = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            gr = g.clone().requires_grad_()
            fr.fused_rms_norm(x.clone().requires_grad_(), gr, 1e-5).backward(dy)
            grads.append(gr.grad)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("unit_offset", [False, True])
def test_rmsnorm_module_under_autocast(kernels, unit_offset: bool) -> None:
    """RMSNorm(fused, matmul_input) under bf16 autocast gives bf16 (the consumers' cast, made once); its gradients,
    weight included (Gemma's 1 + w gain), match the torch form's within fp32 rounding."""
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-6, fused=True, unit_offset=unit_offset, matmul_input=True)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(4, 9, 64, requires_grad=True)
    dy = torch.randn(4, 9, 64).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    y.backward(dy)
    got = (y, x.grad, norm.weight.grad)
    x.grad, norm.weight.grad = None, None
    fr.ENABLED = False
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_ref = norm(x)  # the torch form: fp32 out, cast to bf16 here as a consumer would
        y_ref.to(torch.bfloat16).backward(dy)
    finally:
        fr.ENABLED = True
    assert y_ref.dtype == torch.float32 and got[0].dtype == torch.bfloat16
    assert float((got[0].float() - y_ref.to(torch.bfloat16).float()).abs().max()) <= float(y_ref.abs().max()) * 2 ** -8
    assert rel(got[1], x.grad.double()) < 1e-6
    assert rel(got[2], norm.weight.grad.double()) < 1e-6


def test_not_applied_where_it_does_not_hold(kernels) -> None:
    assert not fr.applies(torch.randn(3, 4, dtype=torch.float64))
    assert not fr.applies(torch.randn(3, 4).to(torch.bfloat16))
    assert not fr.applies(torch.randn(0, 4))
    fr.ENABLED = False
    try:
        assert not fr.applies(torch.randn(3, 4))
    finally:
        fr.ENABLED = True
    assert fr.applies(torch.randn(3, 4))


def test_norm_feeding_the_residual_stream_stays_fp32(kernels) -> None:
    """A norm not marked matmul_input (post-norm blocks, Gemma's output norms: its output joins the fp32 residual)
    writes fp32 under autocast too: the torch form's values. The model marks only a block's pre-norms and the final
    norm."""
    from scratchlm.config import get_preset
    from scratchlm.model import TransformerLM

    norm = RMSNorm(32, eps=1e-6, fused=True)
    x = torch.randn(3, 5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    assert y.dtype == torch.float32
    assert float((y.double() - F.rms_norm(x.double(), (32,), norm.weight.double(), 1e-6)).abs().max()) < 1e-6
    for placement, marked in (("pre", True), ("sandwich", True), ("post", False)):
        model = TransformerLM(get_preset("llama-tiny", norm_placement=placement, ops_impl="fused"))
        block = model.model.layers[0]
        assert block.input_layernorm.matmul_input is marked and block.post_attention_layernorm.matmul_input is marked
        if placement == "sandwich":
            assert not block.attn_output_norm.matmul_input and not block.ffn_output_norm.matmul_input
        assert model.model.norm is None or model.model.norm.matmul_input
