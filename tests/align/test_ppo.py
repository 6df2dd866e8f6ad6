"""PPO pieces: GAE, KL-shaped rewards, whitening, clipped policy/value losses, value head — hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from scratchlm.align.ppo import ValueModel, gae, ppo_policy_loss, ppo_rewards, ppo_value_loss, whiten
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM


def test_gae_hand_worked_with_masked_tail():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 99.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3], [1.048, 1.4, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0], [1.548, 2.0, 0.0]]))


def test_gae_gamma_lambda_one_is_monte_carlo():
    rewards, values = torch.randn(2, 5), torch.randn(2, 5)
    adv, ret = gae(rewards, values, torch.ones(2, 5), gamma=1.0, lam=1.0)
    togo = rewards.flip(1).cumsum(1).flip(1)
    assert torch.allclose(adv, togo - values, atol=1e-6) and torch.allclose(ret, togo, atol=1e-6)


def test_rewards_put_score_on_last_valid_token_and_kl_everywhere():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 1.0], [0.25, 0.25, 0.25]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    r, kl = ppo_rewards(torch.tensor([2.0, 3.0]), logp, ref, mask, kl_coef=0.1, kl_estimator="k1")
    l2 = math.log(2)
    assert torch.allclose(kl, torch.tensor([[l2, 0.0, -l2], [l2, l2, 0.0]]))
    assert torch.allclose(r, torch.tensor([[-0.1 * l2, 0.0, 0.1 * l2 + 2.0], [-0.1 * l2, -0.1 * l2 + 3.0, 0.0]]))


def test_whiten_unbiased_and_shift_mean():
    x = torch.randn(3, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    sel = x[mask.bool()]
    expect = (sel - sel.mean()) / torch.sqrt(sel.var(unbiased=True) + 1e-8)
    w = whiten(x, mask)
    assert torch.allclose(w[mask.bool()], expect) and torch.equal(w[~mask.bool()], torch.zeros(6, dtype=torch.float64))
    w2 = whiten(x, mask, shift_mean=False)
    assert torch.allclose(w2[mask.bool()], expect + sel.mean())
    with pytest.raises(ValueError, match="at least 2"):
        whiten(x, torch.zeros_like(mask))


@pytest.mark.parametrize("adv,expect_loss,expect_frac", [(1.0, -1.2, 1.0), (-1.0, 1.5, 0.0)])
def test_policy_loss_clipping(adv, expect_loss, expect_frac):
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    old = logp.detach() - math.log(1.5)  # ratio 1.5 everywhere
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, m = ppo_policy_loss(logp, old, torch.full((2, 3), adv), mask, clip_range=0.2)
    assert loss.item() == pytest.approx(expect_loss) and m["clipfrac"] == pytest.approx(expect_frac)
    loss.backward()
    grad_nonzero = bool((logp.grad[mask.bool()] != 0).all())
    assert grad_nonzero == (expect_frac == 0.0)


def test_value_loss_clipped_hand_worked():
    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old, ret = torch.tensor([[0.5, 0.5]]), torch.tensor([[2.0, 0.0]])
    loss = ppo_value_loss(values, old, ret, torch.ones(1, 2), clip_range_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.09) / 2)
    loss.backward()  # token 0: clipped branch active -> no grad; token 1: clipped branch (0.3^2) active too
    assert values.grad.tolist() == [[0.0, 0.0]]
    loss2 = ppo_value_loss(values, old, ret, torch.ones(1, 2), clip_range_value=1.0)
    assert loss2.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2)


def test_value_model_reads_the_final_hidden_state():
    torch.manual_seed(0)
    lm = TransformerLM(get_preset("llama-tiny", vocab_size=40, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2))
    critic = ValueModel(lm)
    ids = torch.randint(0, 40, (2, 6))
    assert torch.equal(critic(ids), torch.zeros(2, 6))  # zero-initialised head
    with torch.no_grad():
        critic.value_head.weight.copy_(lm.lm_head.weight[7:8])  # value = logit of token 7
        critic.value_head.bias.fill_(0.5)
        assert torch.allclose(critic(ids), lm(ids)[..., 7] + 0.5, atol=1e-5)
