"""GRPO family: advantages, clipping, aggregation, GSPO, KL term, DAPO filters — hand-worked and vs the spec."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from scratchlm.align.grpo import (GRPOLossConfig, group_advantages, grpo_loss, informative_groups, preset,
                                  soft_overlong_penalty)
from scratchlm.align.surrogate import aggregate_loss, clipped_surrogate


def test_group_advantages_hand_worked():
    eps = 1e-4
    a = group_advantages(torch.tensor([1.0, 2.0, 3.0]), 3, "group", eps)  # mean 2, unbiased std 1
    assert torch.allclose(a, torch.tensor([-1 / (1 + eps), 0.0, 1 / (1 + eps)]))
    assert torch.equal(group_advantages(torch.tensor([1.0, 2.0, 3.0]), 3, "none"), torch.tensor([-1.0, 0.0, 1.0]))
    # batch scaling: mean per group, std over the batch: std([0, 2, 1, 1]) = sqrt(2/3)
    b = group_advantages(torch.tensor([0.0, 2.0, 1.0, 1.0]), 2, "batch", 0.0)
    s = math.sqrt(2 / 3)
    assert torch.allclose(b, torch.tensor([-1 / s, 1 / s, 0.0, 0.0]))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_all_equal_group_gives_exactly_zero_advantage(scale):
    a = group_advantages(torch.tensor([0.7, 0.7, 0.7, 0.0, 1.0, 1.0]), 3, scale, 1e-6)
    assert torch.equal(a[:3], torch.zeros(3))
    assert bool((a[3:] != 0).all())
    assert torch.equal(group_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))  # singleton groups


def test_clipped_surrogate_both_sides():
    ratio = torch.tensor([0.5, 1.5, 0.5, 1.5, 1.0], requires_grad=True)
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0, 2.0])
    loss, low, high = clipped_surrogate(ratio, adv, 0.2, 0.2)
    assert torch.allclose(loss, torch.tensor([0.8, -1.2, -0.5, 1.5, -2.0]))
    assert low.tolist() == [True, False, False, False, False]
    assert high.tolist() == [False, True, False, False, False]
    loss.sum().backward()
    assert torch.allclose(ratio.grad, torch.tensor([0.0, 0.0, -1.0, 1.0, -2.0]))  # clipped tokens: no gradient
    dapo, _, _ = clipped_surrogate(ratio.detach(), adv, 0.2, 0.28)  # clip-higher
    assert dapo[1].item() == pytest.approx(-1.28) and dapo[0].item() == pytest.approx(0.8)
    dual, _, _ = clipped_surrogate(torch.tensor([5.0, 5.0]), torch.tensor([-1.0, 1.0]), 0.2, 0.2, dual_clip=3.0)
    assert dual.tolist() == pytest.approx([3.0, -1.2])


def test_aggregations_hand_worked_and_fully_masked_rows():
    per = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate_loss(per, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate_loss(per, mask, "token-mean").item() == pytest.approx(2.5)
    assert aggregate_loss(per, mask, "token-mean", num_tokens=10).item() == pytest.approx(1.0)
    assert aggregate_loss(per, mask, "seq-mean-token-sum-norm", max_length=5).item() == pytest.approx(1.0)
    dead = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    for mode in ("seq-mean-token-mean", "token-mean"):
        v = aggregate_loss(per, dead, mode, max_length=5)
        assert torch.isfinite(v)
    assert aggregate_loss(per, dead, "seq-mean-token-mean").item() == pytest.approx(1.0)
    assert aggregate_loss(per, torch.zeros_like(per), "token-mean").item() == 0.0
    with pytest.raises(ValueError, match="max_length"):
        aggregate_loss(per, mask, "seq-mean-token-sum-norm")


def test_overlong_penalty_and_dynamic_filter():
    pen = soft_overlong_penalty(torch.tensor([10, 16, 17, 18, 20, 21]), max_length=20, buffer=4)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    keep = informative_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 2)
    assert keep.tolist() == [False, True, False]


def _reference_loss(logp, old, ref, adv, mask, cfg: GRPOLossConfig) -> float:
    """The spec's formula written out with Python loops (float64)."""
    b, t = logp.shape
    lens = [int(mask[i].sum()) for i in range(b)]
    per = [[0.0] * t for _ in range(b)]
    for i in range(b):
        seq = math.exp(sum(float(logp[i, j] - old[i, j]) for j in range(lens[i])) / max(lens[i], 1))
        for j in range(lens[i]):
            r = seq if cfg.importance_level == "sequence" else math.exp(float(logp[i, j] - old[i, j]))
            a = float(adv[i])
            rc = min(max(r, 1 - cfg.clip_low), 1 + cfg.eps_high)
            lr = float(ref[i, j] - logp[i, j])
            k = {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - lr - 1}[cfg.kl_estimator]
            per[i][j] = -min(r * a, rc * a) + cfg.beta * k
    if cfg.loss_agg == "seq-mean-token-mean":
        return sum(sum(per[i]) / max(lens[i], 1) for i in range(b)) / b
    total = sum(sum(row) for row in per)
    return total / sum(lens) if cfg.loss_agg == "token-mean" else total / (b * cfg.max_completion_length)


@pytest.mark.parametrize("level,agg,beta,est", list(itertools.product(
    ["token", "sequence"], ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"], [0.0, 0.04],
    ["k1", "k3"])))
def test_loss_matches_spec_formula(level, agg, beta, est):
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    clip = (0.2, 0.28) if level == "token" else (3e-2, 4e-2)
    cfg = GRPOLossConfig(importance_level=level, loss_agg=agg, beta=beta, kl_estimator=est, clip_low=clip[0],
                         clip_high=clip[1], max_completion_length=6)
    loss, m = grpo_loss(logp, old, adv, mask, cfg, ref_logp=ref)
    assert loss.item() == pytest.approx(_reference_loss(logp, old, ref, adv, mask, cfg), rel=1e-10, abs=1e-12)
    assert m["clip_low_frac"] + m["clip_high_frac"] > 0  # the random ratios hit both sides somewhere


def test_on_policy_gradient_is_minus_advantage_over_length():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.2, 0.3, 0.9]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, m = grpo_loss(logp, logp.detach(), adv, mask, preset("grpo", beta=0.0))
    loss.backward()
    # d/dlogp_{i,t} = -A_i / (|o_i| * B)
    expect = torch.tensor([[-2 / 6, -2 / 6, -2 / 6], [1 / 4, 1 / 4, 0.0]])
    assert torch.allclose(logp.grad, expect)
    assert loss.item() == pytest.approx(-(2.0 - 1.0) / 2)
    assert m["clip_low_frac"] == 0.0 and m["clip_high_frac"] == 0.0


def test_gspo_sequence_equals_gspo_token_form_value_and_grad():
    g = torch.Generator().manual_seed(2)
    base = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    old = base + 0.01 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    cfg = preset("gspo", clip_low=0.2, clip_high=0.2)  # wide enough that nothing clips
    lp1 = base.clone().requires_grad_(True)
    loss1, _ = grpo_loss(lp1, old, adv, mask, cfg)
    loss1.backward()
    # GSPO-token (verl): log s_it = sg[log s_i] + logp_it - sg[logp_it], per-token min(), seq-mean-token-mean
    lp2 = base.clone().requires_grad_(True)
    log_s = ((lp2 - old) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    s_tok = torch.exp(log_s.detach() + lp2 - lp2.detach())
    per = -torch.minimum(s_tok * adv[:, None], s_tok.clamp(0.8, 1.2) * adv[:, None])
    loss2 = (((per * mask).sum(1) / mask.sum(1)).mean())
    loss2.backward()
    assert loss1.item() == pytest.approx(loss2.item(), rel=1e-12)
    assert torch.allclose(lp1.grad, lp2.grad, rtol=1e-10)
    s = torch.exp(log_s.detach()).squeeze(1)  # analytic: -A_i s_i / (|y_i| B)
    assert torch.allclose(lp1.grad, (-adv * s / mask.sum(1) / 3)[:, None] * mask, rtol=1e-10)


def test_gspo_clips_whole_sequences():
    logp = torch.zeros(2, 3, requires_grad=True)
    old = torch.tensor([[-0.01, -0.01, -0.01], [0.0, 0.0, 0.0]])  # seq 0: s = e^{0.01} > 1 + 4e-4
    loss, m = grpo_loss(logp, old, torch.tensor([1.0, 1.0]), torch.ones(2, 3), preset("gspo"))
    loss.backward()
    assert torch.equal(logp.grad[0], torch.zeros(3)) and bool((logp.grad[1] != 0).all())
    assert m["clip_high_frac"] == pytest.approx(0.5)


def test_kl_term_and_config_errors():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    loss, m = grpo_loss(logp, logp, torch.zeros(1), torch.ones(1, 2), preset("grpo", beta=0.1), ref_logp=ref)
    k3 = 0.5 - 1 + math.log(2)
    assert loss.item() == pytest.approx(0.1 * k3 / 2) and m["kl"] == pytest.approx(k3 / 2)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, logp, torch.zeros(1), torch.ones(1, 2), preset("grpo"))
    with pytest.raises(ValueError, match="loss_agg"):
        GRPOLossConfig(loss_agg="mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        preset("dr_grpo")
    with pytest.raises(ValueError, match="unknown GRPO preset"):
        preset("ppo")
    assert preset("dapo").eps_high == 0.28 and preset("gspo").clip_low == 3e-4


def test_kl_is_correction_scales_by_the_ratio_off_policy():
    logp = torch.log(torch.tensor([[0.5, 0.4]], dtype=torch.float64))
    old = logp - 0.1  # rho = e^{0.1}, inside the clip range
    ref = torch.log(torch.tensor([[0.25, 0.4]], dtype=torch.float64))
    cfg = preset("grpo", beta=0.5, clip_low=0.2, kl_is_correction=True)
    loss, _ = grpo_loss(logp, old, torch.zeros(1, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64), cfg,
                        ref_logp=ref)
    k3 = 0.5 - 1 + math.log(2)  # token 0; token 1 has ref = logp -> 0
    assert loss.item() == pytest.approx(0.5 * math.exp(0.1) * k3 / 2, rel=1e-12)
