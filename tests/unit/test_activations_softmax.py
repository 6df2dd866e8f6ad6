"""Activations vs torch.nn.functional; stable softmax/log_softmax vs torch, overflow and masking."""

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import gelu, gelu_tanh, log_softmax, relu, sigmoid, silu, softmax
from scratchlm.nn.activations import get_activation

CASES = [
    (relu, F.relu),
    (gelu, lambda x: F.gelu(x, approximate="none")),
    (gelu_tanh, lambda x: F.gelu(x, approximate="tanh")),
    (silu, F.silu),
    (sigmoid, torch.sigmoid),
]


@pytest.mark.parametrize("ours, ref", CASES, ids=["relu", "gelu", "gelu_tanh", "silu", "sigmoid"])
def test_activation_values_and_grads(ours, ref) -> None:
    x = torch.cat([torch.randn(500) * 4, torch.tensor([-1000.0, -80.0, -1e-3, 0.5, 80.0, 1000.0])])
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    ya, yb = ours(xa), ref(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-6)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.isfinite(xa.grad).all()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)


def test_get_activation_error_lists_names() -> None:
    with pytest.raises(ValueError, match="valid:.*gelu"):
        get_activation("swish2")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax_match_torch_any_dim(dim: int) -> None:
    x = torch.randn(4, 5, 6) * 5
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    torch.testing.assert_close(softmax(xa, dim), F.softmax(xb, dim), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(log_softmax(xa, dim), F.log_softmax(xb, dim), rtol=1e-6, atol=1e-6)
    g = torch.randn_like(x)
    (softmax(xa, dim) * g).sum().backward()
    (F.softmax(xb, dim) * g).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)


def test_softmax_large_logits_do_not_overflow() -> None:
    # Seed bug: exp(x) / sum(exp(x)) without subtracting the max overflows to inf/inf = NaN.
    x = torch.tensor([[1000.0, 999.0, 10.0], [-1000.0, -1001.0, -1002.0]])
    naive = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    assert torch.isnan(naive).any()
    torch.testing.assert_close(softmax(x), F.softmax(x.double(), -1).float(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(log_softmax(x), F.log_softmax(x.double(), -1).float(), rtol=1e-6, atol=1e-6)


def test_masked_softmax_and_fully_masked_row() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[True, True, False, True], [False, False, False, False], [True, False, False, False]])
    p = softmax(x, -1, mask=mask)
    ref = F.softmax(x.detach().masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(p[[0, 2]], ref[[0, 2]], rtol=1e-6, atol=1e-7)
    assert torch.isnan(ref[1]).all()  # torch's behaviour on a fully masked row
    assert torch.equal(p[1], torch.zeros(4))  # ours: defined as zeros
    lp = log_softmax(x, -1, mask=mask)
    assert torch.isneginf(lp[1]).all() and torch.isneginf(lp[0, 2])
    p.sum().backward()
    assert torch.isfinite(x.grad).all()
    all_neg_inf = torch.full((2, 3), float("-inf"))
    assert torch.equal(softmax(all_neg_inf), torch.zeros(2, 3))
