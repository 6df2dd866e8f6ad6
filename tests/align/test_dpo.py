"""DPO family vs a direct re-derivation in Python floats; gradients; metrics."""

from __future__ import annotations

import math

import pytest
import torch

from scratchlm.align.dpo import dpo_loss

PC, PR, RC, RR = [-3.0, -5.0, -2.0], [-4.0, -4.5, -6.0], [-3.5, -5.0, -2.5], [-3.0, -5.0, -5.0]


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def _h(i: int) -> tuple[float, float]:
    return PC[i] - RC[i], PR[i] - RR[i]


def _ref(loss_type: str, beta: float, eps: float = 0.0) -> float:
    out = []
    for i in range(3):
        hc, hr = _h(i)
        h = hc - hr
        out.append({
            "sigmoid": -_logsig(beta * h),
            "hinge": max(0.0, 1 - beta * h),
            "cdpo": -(1 - eps) * _logsig(beta * h) - eps * _logsig(-beta * h),
            "robust": (-(1 - eps) * _logsig(beta * h) + eps * _logsig(-beta * h)) / (1 - 2 * eps),
        }[loss_type])
    return sum(out) / 3


@pytest.mark.parametrize("loss_type,eps", [("sigmoid", 0.0), ("hinge", 0.0), ("cdpo", 0.1), ("robust", 0.1),
                                           ("robust", 0.3)])
def test_losses_match_rederivation(loss_type, eps):
    loss, _ = dpo_loss(_t(PC), _t(PR), _t(RC), _t(RR), beta=0.5, loss_type=loss_type, label_smoothing=eps)
    assert loss.item() == pytest.approx(_ref(loss_type, 0.5, eps), rel=1e-12)


def test_cdpo_and_rdpo_differ_and_reduce_to_dpo_at_eps_zero():
    args = (_t(PC), _t(PR), _t(RC), _t(RR))
    sig = dpo_loss(*args, beta=0.5)[0].item()
    assert dpo_loss(*args, beta=0.5, loss_type="cdpo")[0].item() == pytest.approx(sig, rel=1e-12)
    assert dpo_loss(*args, beta=0.5, loss_type="robust")[0].item() == pytest.approx(sig, rel=1e-12)
    c = dpo_loss(*args, beta=0.5, loss_type="cdpo", label_smoothing=0.2)[0].item()
    r = dpo_loss(*args, beta=0.5, loss_type="robust", label_smoothing=0.2)[0].item()
    assert abs(c - r) > 1e-3


def test_ipo_hand_worked_with_and_without_length_normalisation():
    # one pair: hc = 2 over 4 tokens, hr = -1 over 2 tokens; beta = 0.25 -> target 1/(2 beta) = 2
    args = (_t([0.0]), _t([-1.0]), _t([-2.0]), _t([0.0]))
    loss, _ = dpo_loss(*args, beta=0.25, loss_type="ipo", chosen_lengths=_t([4.0]), rejected_lengths=_t([2.0]))
    assert loss.item() == pytest.approx((2 / 4 - (-1 / 2) - 2) ** 2)
    loss_sum, _ = dpo_loss(*args, beta=0.25, loss_type="ipo", ipo_length_normalize=False)
    assert loss_sum.item() == pytest.approx((3 - 2) ** 2)
    with pytest.raises(ValueError, match="chosen_lengths"):
        dpo_loss(*args, beta=0.25, loss_type="ipo")


def test_sigmoid_gradient_and_reference_is_frozen():
    pc, pr = _t(PC).requires_grad_(True), _t(PR).requires_grad_(True)
    rc = _t(RC).requires_grad_(True)
    loss, _ = dpo_loss(pc, pr, rc, _t(RR), beta=0.5)
    loss.backward()
    # dL/dS_theta(y_w) = -beta sigmoid(-beta h) / B ; dL/dS_theta(y_l) = +beta sigmoid(-beta h) / B
    expect = [-0.5 / (1 + math.exp(0.5 * (hc - hr))) / 3 for hc, hr in map(_h, range(3))]
    assert torch.allclose(pc.grad, _t(expect)) and torch.allclose(pr.grad, -_t(expect))
    assert rc.grad is None


def test_metrics_hand_worked():
    _, m = dpo_loss(_t(PC), _t(PR), _t(RC), _t(RR), beta=0.5)
    hs = [_h(i) for i in range(3)]  # (0.5, -1.0), (0.0, 0.5), (0.5, -1.0)
    assert m["rewards/chosen"] == pytest.approx(0.5 * sum(h[0] for h in hs) / 3)
    assert m["rewards/rejected"] == pytest.approx(0.5 * sum(h[1] for h in hs) / 3)
    assert m["rewards/accuracies"] == pytest.approx(2 / 3)
    assert m["rewards/margins"] == pytest.approx(0.5 * sum(a - b for a, b in hs) / 3)
    assert m["logps/chosen"] == pytest.approx(sum(PC) / 3)


def test_bad_arguments():
    a = _t([0.0])
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(a, a, a, a, beta=0.0)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(a, a, a, a, loss_type="kto")
    with pytest.raises(ValueError, match="0.5"):
        dpo_loss(a, a, a, a, loss_type="robust", label_smoothing=0.5)
