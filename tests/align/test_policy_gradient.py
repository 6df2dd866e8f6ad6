"""The policy-gradient family's switches against hand-worked values: advantages, per-token losses,
eps >= 1, all-equal groups, empty masks and aggregation, and the micro-batch train steps."""

from __future__ import annotations

import math

import pytest
import torch

from scratchlm.align.grpo import GRPOLossConfig, grpo_loss, preset
from scratchlm.align.policy_gradient import (compute_advantages, microbatch_train_step, naive_policy_gradient_loss,
                                             policy_gradient_loss)
from scratchlm.align.sft import sft_loss, sft_microbatch_train_step
from scratchlm.align.surrogate import aggregate_loss

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 3.0])  # groups of 2: (1, 0), (1, 1), (0, 3)


def test_advantages_of_each_loss_type_hand_worked():
    assert compute_advantages(REWARDS, 2, "no_baseline").tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 3.0]
    assert compute_advantages(REWARDS, 2, "reinforce_with_baseline").tolist() == [0.5, -0.5, 0.0, 0.0, -1.5, 1.5]
    # unbiased std of (1, 0) is sqrt(1/2); of (0, 3) it is 3 sqrt(1/2)
    s = math.sqrt(0.5)
    for kind in ("grpo", "grpo_clip"):
        a = compute_advantages(REWARDS, 2, kind, "group", 0.0)
        assert a.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0, -1.5 / (3 * s), 1.5 / (3 * s)])
    none = compute_advantages(REWARDS, 2, "grpo", "none")
    assert torch.equal(none, compute_advantages(REWARDS, 2, "reinforce_with_baseline"))
    with pytest.raises(ValueError, match="loss_type"):
        compute_advantages(REWARDS, 2, "ppo")


def test_all_equal_groups_give_zero_advantage_and_zero_gradient():
    rewards = torch.tensor([0.3, 0.3, 0.3, 1.0, 1.0, 1.0])
    logp = torch.log(torch.tensor([[0.5, 0.2]] * 6)).requires_grad_(True)
    for kind in ("reinforce_with_baseline", "grpo", "grpo_clip"):
        adv = compute_advantages(rewards, 3, kind, "group", 1e-6)
        assert torch.equal(adv, torch.zeros(6))
        per, _ = policy_gradient_loss(logp, kind, adv, logp.detach())
        aggregate_loss(per, torch.ones(6, 2)).backward()
        assert torch.equal(logp.grad, torch.zeros(6, 2))
        logp.grad = None


def test_naive_losses_are_minus_advantage_times_logp():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.8]])).requires_grad_(True)
    adv = torch.tensor([2.0, -1.0])
    per = naive_policy_gradient_loss(adv, logp)
    expect = torch.tensor([[2 * math.log(2), 2 * math.log(4)], [math.log(0.1), math.log(0.8)]])
    assert torch.allclose(per.detach(), expect)
    for kind in ("no_baseline", "reinforce_with_baseline", "grpo"):
        got, meta = policy_gradient_loss(logp, kind, adv)
        assert torch.equal(got, per) and meta == {}
    per.sum().backward()
    assert logp.grad.tolist() == [[-2.0, -2.0], [1.0, 1.0]]  # -A d(log pi)


def test_clip_with_eps_of_one_and_more_hand_worked():
    """eps_low = 1.5 puts the lower bound at -0.5 (never binds); eps_high = 2 caps rho at 3."""
    rho = torch.tensor([[0.1, 3.5, 2.0, 0.1]], dtype=torch.float64)
    logp = torch.log(rho).requires_grad_(True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    per = torch.empty(1, 4, dtype=torch.float64)
    grads = []
    for t in range(4):  # one token per sequence: the advantage is per sequence
        lp = logp[:, t:t + 1]
        p, meta = policy_gradient_loss(lp, "grpo_clip", adv[:, t], old[:, t:t + 1], clip_low=1.5, clip_high=2.0)
        per[0, t] = p.item()
        grads.append(torch.autograd.grad(p.sum(), logp)[0][0, t].item())
        if t == 1:
            assert bool(meta["clip_high"].all()) and not bool(meta["clip_low"].any())
    # token 0: A<0, rho 0.1 > -0.5, unclipped -> -A rho = 0.1; token 1: A>0, rho 3.5 > 3 -> -3 (no gradient)
    # token 2: rho 2 < 3 -> -2; token 3: A>0, rho 0.1 -> -min(0.1, 0.1) = -0.1
    assert per[0].tolist() == pytest.approx([0.1, -3.0, -2.0, -0.1])
    # d(-A rho)/dlogp = -A rho
    assert grads == pytest.approx([0.1, 0.0, -2.0, -0.1])
    with pytest.raises(ValueError, match=">= 0"):
        GRPOLossConfig(clip_low=-0.1)
    cfg = GRPOLossConfig(clip_low=10.0, clip_high=10.0, beta=0.0)  # DeepSeek-R1's eps = 10 is valid
    loss, m = grpo_loss(logp.detach().T, old.T, adv[0], torch.ones(4, 1, dtype=torch.float64), cfg)
    assert m["clip_low_frac"] == 0.0 and m["clip_high_frac"] == 0.0


def test_sequence_ratio_is_the_length_normalised_geometric_mean():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    old = torch.tensor([[-1.2, -2.4, 0.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.float64)  # row 1 is empty
    _, meta = policy_gradient_loss(logp, "grpo_clip", torch.tensor([1.0, 1.0]), old, mask,
                                   importance_level="sequence")
    assert meta["ratio"].shape == (2, 1)
    assert meta["ratio"][0, 0].item() == pytest.approx(math.exp((0.2 + 0.4) / 2))  # padding's -9 never read
    assert meta["ratio"][1, 0].item() == 1.0  # an empty sequence has ratio 1 (trl)
    with pytest.raises(ValueError, match="response_mask"):
        policy_gradient_loss(logp, "grpo_clip", torch.ones(2), old, importance_level="sequence")
    with pytest.raises(ValueError, match="old_log_probs"):
        policy_gradient_loss(logp, "grpo_clip", torch.ones(2))


def test_aggregations_with_empty_rows_and_an_empty_batch():
    per = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [5.0, 5.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # per sequence: (2 + 4 + 0) / 3 sequences; batch: 10 / 4 tokens; constant: 10 / (3 * 5)
    assert aggregate_loss(per, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert aggregate_loss(per, mask, "token-mean").item() == pytest.approx(2.5)
    assert aggregate_loss(per, mask, "seq-mean-token-sum-norm", max_length=5).item() == pytest.approx(10 / 15)
    for mode in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        empty = aggregate_loss(per, torch.zeros_like(mask), mode, max_length=5)
        assert empty.item() == 0.0
        empty.backward()
        assert torch.equal(per.grad, torch.zeros(3, 3))  # zero gradients, not NaN
        per.grad = None


def test_grpo_loss_with_every_switch_on_an_empty_mask_is_finite():
    logp = torch.randn(2, 3, requires_grad=True)
    for kind in ("no_baseline", "reinforce_with_baseline", "grpo", "grpo_clip"):
        for level in ("token", "sequence"):
            cfg = GRPOLossConfig(pg_loss=kind, importance_level=level, beta=0.1, kl_is_correction=True)
            loss, m = grpo_loss(logp, logp.detach() - 0.1, torch.ones(2), torch.zeros(2, 3), cfg,
                                ref_logp=torch.zeros(2, 3))
            loss.backward()
            assert loss.item() == 0.0 and m == {"clip_low_frac": 0.0, "clip_high_frac": 0.0, "kl": 0.0}
            assert torch.equal(logp.grad, torch.zeros(2, 3))
            logp.grad = None


def test_gspo_kl_is_weighted_by_the_sequence_ratio_and_clip_fraction_counts_sequences():
    logp = torch.zeros(2, 3, dtype=torch.float64)
    old = torch.tensor([[-0.01, -0.01, -0.01], [0.0, 0.0, 0.0]], dtype=torch.float64)  # s_0 = e^0.01
    ref = torch.tensor([[0.0, math.log(0.5), 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    cfg = preset("gspo", beta=1.0, kl_is_correction=True)
    loss, m = grpo_loss(logp, old, torch.zeros(2, dtype=torch.float64), mask, cfg, ref_logp=ref)
    k3 = 0.5 - 1 - math.log(0.5)  # token 1 of sequence 0
    # advantage 0: only the KL term; sequence 0: s_0 * k3 / 3 tokens, sequence 1: 0; mean over 2 sequences
    assert loss.item() == pytest.approx(math.exp(0.01) * k3 / 3 / 2, rel=1e-12)
    loss, m = grpo_loss(logp, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask, cfg, ref_logp=ref)
    assert m["clip_high_frac"] == 0.5  # 1 of 2 sequences (a token mean would say 3 / 4)


def test_unclipped_losses_refuse_off_policy_reuse_and_scale_rewards():
    from scratchlm.align.grpo_trainer import GRPOTrainConfig

    with pytest.raises(ValueError, match="on-policy"):
        GRPOTrainConfig(num_iterations=2, loss=GRPOLossConfig(pg_loss="grpo"))
    with pytest.raises(ValueError, match="does not apply"):
        GRPOLossConfig(pg_loss="no_baseline", scale_rewards="group")
    GRPOTrainConfig(group_size=1, loss=GRPOLossConfig(pg_loss="no_baseline"))  # REINFORCE needs no group


def test_microbatch_steps_equal_one_batch():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)

    def grad_of(parts: list[slice], agg: str, gas: int, **norm) -> torch.Tensor:
        logp.grad = None
        for sl in parts:
            per, _ = policy_gradient_loss(logp[sl], "grpo_clip", adv[sl], logp[sl].detach())
            microbatch_train_step(per, mask[sl], gas, agg, max_length=5, **norm)
        return logp.grad.clone()

    halves = [slice(0, 2), slice(2, 4)]
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):  # equal-size micro-batches: mean of means
        assert torch.allclose(grad_of(halves, agg, 2), grad_of([slice(0, 4)], agg, 1))
    assert torch.allclose(grad_of(halves, "token-mean", 1, num_tokens=11), grad_of([slice(0, 4)], "token-mean", 1))
    # SFT: the masked-sum step over the batch's token count equals sft_loss's token mean (and F.cross_entropy)
    logits = torch.randn(2, 4, 7, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 4))
    smask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0]])
    logits.grad = None
    ref = sft_loss(logits, ids, smask)
    want = torch.autograd.grad(ref, logits)[0]
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss, meta = sft_microbatch_train_step(lp, smask[:, 1:], 1, normalize_constant=4.0)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6) and int(meta["tokens"]) == 4
    assert torch.allclose(logits.grad, want, atol=1e-7)
