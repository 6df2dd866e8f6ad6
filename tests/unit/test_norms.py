"""RMSNorm, LayerNorm, BatchNorm1d vs torch.nn counterparts (values, gradients, running stats),
plus seed-bug regressions: unbiased variance in LayerNorm, mean-centred RMSNorm."""

import pytest
import torch

from scratchlm.nn import BatchNorm1d, LayerNorm, RMSNorm


def _check_grads(ours: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, tol: float = 1e-5) -> None:
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    ya, yb = ours(xa), ref(xb)
    torch.testing.assert_close(ya, yb, rtol=tol, atol=tol)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=tol, atol=tol)
    for (name, pa), pb in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=tol, atol=tol, msg=name)


def test_rmsnorm_matches_torch() -> None:
    ours, ref = RMSNorm(16, eps=1e-6), torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
    _check_grads(ours, ref, torch.randn(3, 5, 16) * 3 + 1)


def test_rmsnorm_computes_in_fp32_and_casts_back() -> None:
    norm = RMSNorm(64)
    x = (torch.randn(4, 64) * 100).to(torch.bfloat16)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    ref = torch.nn.functional.rms_norm(x.float(), (64,), eps=1e-6).to(torch.bfloat16)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


def test_rmsnorm_is_not_mean_centred() -> None:
    # Seed bug: using (x - mean)^2 instead of x^2. A shifted input separates the two.
    x = torch.randn(8, 32) + 5.0
    ours = RMSNorm(32)(x)
    centred = (x - x.mean(-1, keepdim=True)) / ((x - x.mean(-1, keepdim=True)) ** 2 + 1e-6).mean(-1, keepdim=True).sqrt()
    assert (ours - centred).abs().max() > 0.5
    torch.testing.assert_close(ours, torch.nn.functional.rms_norm(x, (32,), eps=1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch(bias: bool) -> None:
    ours, ref = LayerNorm(10, eps=1e-5, bias=bias), torch.nn.LayerNorm(10, eps=1e-5, bias=bias)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
        if bias:
            ours.bias.normal_()
            ref.bias.copy_(ours.bias)
    _check_grads(ours, ref, torch.randn(2, 7, 10) * 2 - 1)


def test_layernorm_uses_biased_variance() -> None:
    # Seed bug: torch.var's default unbiased (N-1) estimator. With D=4 the two differ by sqrt(4/3).
    x = torch.randn(16, 4)
    ours = LayerNorm(4)(x)
    unbiased = (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, unbiased=True) + 1e-5).sqrt()
    assert (ours - unbiased).abs().max() > 0.05
    torch.testing.assert_close(ours, torch.nn.functional.layer_norm(x, (4,), eps=1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(16, 6), (8, 6, 5)])
def test_batchnorm_train_and_eval_match_torch(shape: tuple[int, ...]) -> None:
    ours, ref = BatchNorm1d(6, momentum=0.2), torch.nn.BatchNorm1d(6, momentum=0.2)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
    for _ in range(4):  # several training steps: running stats must track torch's (unbiased var update)
        x = torch.randn(*shape) * 2 + 0.5
        _check_grads(ours, ref, x)
    torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-6, atol=1e-6)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 4
    ours.eval()
    ref.eval()
    x = torch.randn(*shape)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_batchnorm_bad_input() -> None:
    with pytest.raises(ValueError, match=r"expects \(B, 6\)"):
        BatchNorm1d(6)(torch.randn(4, 5))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        BatchNorm1d(6)(torch.randn(1, 6))
