"""fp32 linear products through oneDNN (nn/onednn_linear.py, Linear(fused=True)) against float64 products and
torch's own autograd of x @ W.T + b: values and the gradients of x, W and b."""

import pytest
import torch

from scratchlm.nn import onednn_linear
from scratchlm.nn.linear import Linear

requires_onednn = pytest.mark.skipif(not onednn_linear.onednn_available(), reason="torch built without oneDNN")


def _float64_reference(x, w, b, dy):
    """y = x W^T + b and its gradients, by torch's autograd in float64."""
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = b.detach().double().requires_grad_() if b is not None else None
    y = xd @ wd.t() + (bd if bd is not None else 0.0)
    y.backward(dy.double())
    return y, xd.grad, wd.grad, bd.grad if bd is not None else None


@requires_onednn
@pytest.mark.parametrize("shape", [(37, 96), (3, 11, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_float64(shape, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(80, 96, generator=g, requires_grad=True)
    b = torch.randn(80, generator=g, requires_grad=True) if bias else None
    y = onednn_linear.linear(x, w, b)
    assert y.grad_fn is not None and "OneDnn" in type(y.grad_fn).__name__  # the fast path ran
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    want, dx, dw, db = _float64_reference(x, w, b, dy)
    # fp32 rounding of sums of 96 (forward, dx) and 37-33 (dw) products of N(0, 1) values
    torch.testing.assert_close(y.double(), want, rtol=0, atol=1e-4)
    torch.testing.assert_close(x.grad.double(), dx, rtol=0, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), dw, rtol=0, atol=1e-4)
    if bias:
        torch.testing.assert_close(b.grad.double(), db, rtol=0, atol=1e-4)


@requires_onednn
def test_fused_linear_module_equals_reference_module_and_skips_frozen_gradients():
    torch.manual_seed(1)
    ref, fast = Linear(64, 48, bias=True), Linear(64, 48, bias=True, fused=True)
    fast.load_state_dict(ref.state_dict())
    fast.weight.requires_grad_(False)  # a frozen base (LoRA): only dx is computed
    ref.weight.requires_grad_(False)
    x = torch.randn(2, 9, 64).transpose(0, 1)  # strided input
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yf = ref(xr), fast(xf)
    torch.testing.assert_close(yf, yr, rtol=1e-5, atol=1e-5)
    dy = torch.randn(yr.shape)
    yr.backward(dy), yf.backward(dy)
    torch.testing.assert_close(xf.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)
    assert fast.weight.grad is None
    assert "fused" in repr(fast) and "fused" not in repr(ref)


def test_other_dtypes_autocast_and_empty_inputs_take_the_reference_product():
    w = torch.randn(8, 16)
    x = torch.randn(4, 16)
    assert not onednn_linear.applies(x.bfloat16(), w.bfloat16())
    assert not onednn_linear.applies(x[:0], w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_linear.applies(x, w)
        y = Linear(16, 8, fused=True)(x)
    assert y.dtype == torch.bfloat16  # autocast's own (bf16) product, as the reference Linear gets
    assert onednn_linear.linear(x[:0], w).shape == (0, 8)
    torch.testing.assert_close(onednn_linear.linear(x.double(), w.double()), x.double() @ w.double().t())


@pytest.mark.parametrize("fused", [False, True])
def test_bias_under_autocast_keeps_the_products_dtype_as_torch_linear(fused):
    """Under bf16 autocast torch's F.linear returns bf16 with the bias in; ours too (an fp32 bias added to the bf16
    product used to promote the output, and everything after it, to fp32)."""
    torch.manual_seed(0)
    lin = Linear(16, 8, bias=True, fused=fused)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
        want = torch.nn.functional.linear(x, lin.weight, lin.bias)
    assert y.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
