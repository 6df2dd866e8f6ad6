"""The attention softmax's vectorised exp (kernels/csrc/softmax_exp.h) against torch.exp in float64."""

from __future__ import annotations

import pytest
import torch

from scratchlm.kernels.build import native

pytestmark = pytest.mark.skipif(native() is None, reason="no C++ compiler: the torch step is the only path")


def test_exp_within_two_ulp_and_underflow_to_zero() -> None:
    x = torch.cat([torch.linspace(-87.3, 0.0, 100003), torch.linspace(0.0, 20.0, 1001),
                   torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 10 - 20])
    out, total = native().exp_sum(x, 0.0)
    ref = torch.exp(x.double())
    ulp = torch.finfo(torch.float32).eps * ref  # one float32 ulp at the value (up to 2x)
    assert ((out.double() - ref).abs() <= 2 * ulp).all()
    assert abs(total - ref.sum().item()) <= 1e-6 * ref.sum().item()
    for n in (4, 12):  # the scalar tail and the 8-lane body
        dead = torch.tensor([float("-inf"), -1e4, -90.0, -88.0] * 3)[:n]  # masked keys, underflow: exactly 0
        out, total = native().exp_sum(dead, 0.0)
        assert torch.equal(out, torch.zeros(n)) and total == 0.0


@pytest.mark.parametrize("n", [1, 7, 8, 9, 31])  # the 8-lane body and the scalar tail
def test_exp_sum_subtracts_the_max_over_any_length(n: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 5
    out, total = native().exp_sum(x, float(x.max()))
    ref = torch.exp((x - x.max()).double())  # of the fp32 difference, as the kernel takes it
    assert ((out.double() - ref).abs() <= 2 * torch.finfo(torch.float32).eps * ref).all()
    assert total == pytest.approx(ref.sum().item(), rel=1e-6)
