"""Cross entropy (reference and fast path) against F.cross_entropy; perplexity and bits per byte."""

import math

import pytest
import torch
import torch.nn.functional as F

from scratchlm.train.losses import bits_per_byte, cross_entropy, perplexity


def _data(seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 7, 11, generator=g) * scale).requires_grad_(True)
    targets = torch.randint(0, 11, (3, 7), generator=g)
    targets[0, :3] = -100
    targets[2, 5] = -100
    return logits, targets


@pytest.mark.parametrize("impl", ["reference", "torch"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch_values_and_grads(impl, smoothing, reduction):
    logits, targets = _data()
    ours = cross_entropy(logits, targets, label_smoothing=smoothing, reduction=reduction, impl=impl)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    ref = F.cross_entropy(logits.transpose(1, 2), targets, label_smoothing=smoothing, reduction=reduction)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_z_loss_adds_mean_squared_log_partition(impl):
    logits, targets = _data(1)
    z = 1e-3
    ours = cross_entropy(logits, targets, z_loss=z, impl=impl)
    valid = targets != -100
    lse = torch.logsumexp(logits, dim=-1)[valid]
    ref = F.cross_entropy(logits.transpose(1, 2), targets) + z * lse.square().mean()
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-7)


def test_stable_for_huge_logits_and_bf16_input():
    logits, targets = _data(2, scale=1e4)
    ours = cross_entropy(logits, targets)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, F.cross_entropy(logits.transpose(1, 2), targets), rtol=1e-6, atol=1e-3)
    bf = logits.detach().bfloat16()
    torch.testing.assert_close(cross_entropy(bf, targets), F.cross_entropy(bf.float().transpose(1, 2), targets))


def test_all_ignored_is_nan_like_torch_and_bad_shapes_raise():
    logits = torch.randn(2, 4, 5)
    targets = torch.full((2, 4), -100)
    assert torch.isnan(cross_entropy(logits, targets)) and torch.isnan(F.cross_entropy(logits.transpose(1, 2), targets))
    with pytest.raises(ValueError, match="disagree"):
        cross_entropy(logits, targets[:, :3])
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(logits, targets, label_smoothing=1.5)


def test_perplexity_and_bits_per_byte():
    logits, targets = _data(3)
    loss = cross_entropy(logits, targets).item()
    valid = targets != -100
    probs = torch.softmax(logits.detach().double(), -1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)[valid]
    assert perplexity(loss) == pytest.approx(float(probs.prod() ** (-1 / probs.numel())), rel=1e-4)
    n_bytes = 37
    assert bits_per_byte(loss, probs.numel(), n_bytes) == pytest.approx(float(-probs.log2().sum() / n_bytes), rel=1e-5)
    assert perplexity(1e6) == math.inf
    with pytest.raises(ValueError, match="n_bytes"):
        bits_per_byte(1.0, 10, 0)
