"""KL estimators: values and expected gradients by exact enumeration over a 6-way categorical (spec §1)."""

from __future__ import annotations

import math

import pytest
import torch

from scratchlm.align.kl import kl_estimate, kl_loss_term

TOL = dict(rtol=1e-9, atol=1e-12)


def _dists():
    torch.manual_seed(3)
    theta = torch.randn(6, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, dtype=torch.float64), dim=0)
    return theta, ref


def _kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) from log-probs, by definition."""
    return (a.exp() * (a - b)).sum()


def test_hand_worked_values():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # log r = log(0.25/0.5) = -log 2, r = 0.5
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))


def test_k1_k3_unbiased_k2_not_by_enumeration():
    theta, ref = _dists()
    logq = torch.log_softmax(theta.detach(), 0)
    q = logq.exp()
    true = _kl(logq, ref)
    assert torch.allclose((q * kl_estimate(logq, ref, "k1")).sum(), true, **TOL)
    assert torch.allclose((q * kl_estimate(logq, ref, "k3")).sum(), true, **TOL)
    assert abs(float((q * kl_estimate(logq, ref, "k2")).sum() - true)) > 1e-4  # biased
    assert bool((kl_estimate(logq, ref, "k3") >= 0).all()) and bool((kl_estimate(logq, ref, "k1") < 0).any())


def _expected_grad(loss_fn) -> torch.Tensor:
    """E_{y~q}[grad_theta loss(y)] with q = softmax(theta), samples not differentiated (on-policy)."""
    theta, ref = _dists()
    logq = torch.log_softmax(theta, 0)
    per_sample = loss_fn(logq, ref)  # (6,) loss for each outcome y
    (grad,) = torch.autograd.grad((logq.exp().detach() * per_sample).sum(), theta)
    return grad


def _true_grad(forward: bool) -> torch.Tensor:
    theta, ref = _dists()
    logq = torch.log_softmax(theta, 0)
    (grad,) = torch.autograd.grad(_kl(ref, logq) if forward else _kl(logq, ref), theta)
    return grad


def test_expected_gradients_match_the_caveat():
    g1 = _expected_grad(lambda lq, r: kl_estimate(lq, r, "k1"))
    assert torch.allclose(g1, torch.zeros(6, dtype=torch.float64), atol=1e-12)
    reverse, forward = _true_grad(False), _true_grad(True)
    assert not torch.allclose(reverse, forward, atol=1e-3)
    assert torch.allclose(_expected_grad(lambda lq, r: kl_estimate(lq, r, "k2")), reverse, **TOL)
    assert torch.allclose(_expected_grad(lambda lq, r: kl_estimate(lq, r, "k3")), forward, **TOL)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_is_corrected_term_gives_reverse_kl_gradient(estimator):
    g = _expected_grad(lambda lq, r: kl_loss_term(lq, r, estimator, is_correction=True))
    assert torch.allclose(g, _true_grad(False), **TOL)


def test_is_correction_value_is_estimator_on_policy():
    theta, ref = _dists()
    logq = torch.log_softmax(theta, 0)
    assert torch.allclose(kl_loss_term(logq, ref, "k3", is_correction=True), kl_estimate(logq, ref, "k3"), **TOL)
    old = logq.detach() - 0.1  # off-policy: rho = e^{0.1}
    val = kl_loss_term(logq, ref, "k3", old_logp=old, is_correction=True)
    assert torch.allclose(val, math.exp(0.1) * kl_estimate(logq, ref, "k3"), **TOL)


def test_bad_estimator_and_clamp():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")
    v = kl_estimate(torch.tensor([0.0]), torch.tensor([50.0]), "k3", clamp=20.0)
    assert v.item() == pytest.approx(math.exp(20.0) - 21.0, rel=1e-6)
