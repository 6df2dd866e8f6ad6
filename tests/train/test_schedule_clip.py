"""LR schedules vs torch.optim.lr_scheduler; global-norm clipping vs torch.nn.utils.clip_grad_norm_."""

import pytest
import torch

from scratchlm.train.clip import clip_grad_norm
from scratchlm.train.schedule import cosine_lr, lr_at, wsd_lr


def _torch_lrs(scheduler_factory, steps: int, lr: float) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = scheduler_factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_matches_torch_warmup_and_cosine_annealing():
    max_lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 60
    warm = _torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, 1 / warmup, 1.0, warmup - 1), warmup, max_lr)
    cos = _torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, total - warmup, min_lr), total - warmup + 1, max_lr)
    ours = [cosine_lr(s, max_lr, min_lr, warmup, total) for s in range(total + 5)]
    assert ours[:warmup] == pytest.approx(warm, rel=1e-9)
    assert ours[warmup:total + 1] == pytest.approx(cos, rel=1e-6)
    assert ours[total:] == [min_lr] * 5


def test_wsd_phases():
    max_lr, min_lr, warmup, total = 2e-3, 0.0, 5, 50  # decay over the last 10 steps
    lrs = [wsd_lr(s, max_lr, min_lr, warmup, total, decay_frac=0.2) for s in range(total)]
    assert lrs[:warmup] == pytest.approx([max_lr * (i + 1) / warmup for i in range(warmup)])
    assert lrs[warmup:40] == [max_lr] * 35
    assert lrs[40:] == pytest.approx([max_lr * (1 - (i + 1) / 10) for i in range(10)])
    assert lr_at("constant", 30, max_lr, min_lr, warmup, total) == max_lr
    with pytest.raises(ValueError, match="min_lr"):
        cosine_lr(0, 1e-3, 1e-2, 0, 10)
    with pytest.raises(ValueError, match="schedule"):
        lr_at("linear", 0, 1e-3, 0.0, 0, 10)


@pytest.mark.parametrize("max_norm", [0.05, 1.0, 1e3])
def test_clip_matches_torch(max_norm):
    grads = [torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    a = [torch.nn.Parameter(torch.zeros(4, 3)) for _ in grads]
    b = [torch.nn.Parameter(torch.zeros(4, 3)) for _ in grads]
    for pa, pb, g in zip(a, b, grads):
        pa.grad, pb.grad = g.clone(), g.clone()
    a.append(torch.nn.Parameter(torch.zeros(2)))  # a parameter without a gradient is skipped
    n_ours = clip_grad_norm(a, max_norm)
    n_ref = torch.nn.utils.clip_grad_norm_(b, max_norm)
    torch.testing.assert_close(n_ours, n_ref)
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa.grad, pb.grad)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm(a, 0.0)
