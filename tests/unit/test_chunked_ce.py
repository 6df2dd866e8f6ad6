"""The LM head fused with cross entropy over chunks (train/chunked_ce.py, train/lm_loss.py) against
torch's F.cross_entropy on the whole logits h @ W.T: values and gradients of h and W."""

import copy

import pytest
import torch
import torch.nn.functional as F

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.nn.lora import apply_lora
from scratchlm.train.chunked_ce import chunk_rows, linear_cross_entropy
from scratchlm.train.lm_loss import fused_head_weight, model_cross_entropy


def _torch_ce(h, w, y, eps, z, reduction):
    """Trusted counterpart: F.cross_entropy (+ z * logsumexp^2 over the counted rows)."""
    logits = (h @ w.t()).float().flatten(0, -2)
    flat_y = y.flatten()
    per = F.cross_entropy(logits, flat_y, ignore_index=-100, label_smoothing=eps, reduction="none")
    per = per + z * torch.logsumexp(logits, -1).square() * (flat_y != -100)
    return per.sum() / (flat_y != -100).sum() if reduction == "mean" else per.sum()


@pytest.mark.parametrize("eps,z", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.2, 1e-2)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [5, 16, 1000])
@pytest.mark.parametrize("fused", [False, True])  # True: the products through oneDNN (nn/onednn_linear.py)
def test_values_and_gradients_equal_torch(eps, z, reduction, chunk, fused):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 29, 24, generator=g, requires_grad=True)  # 87 rows: chunks of 5 leave a remainder
    w = (torch.randn(211, 24, generator=g) * 0.5).requires_grad_()
    y = torch.randint(0, 211, (3, 29), generator=g)
    y[0, :7] = -100
    y[2, -1] = -100
    want = _torch_ce(h, w, y, eps, z, reduction)
    gh, gw = torch.autograd.grad(want * 1.7, (h, w))
    got = linear_cross_entropy(h, w, y, label_smoothing=eps, z_loss=z, reduction=reduction, chunk_size=chunk,
                               fused=fused)
    dh, dw = torch.autograd.grad(got * 1.7, (h, w))  # a non-unit upstream gradient scales the kept gradients
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dh, gh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dw, gw, rtol=1e-4, atol=1e-6)


def test_frozen_weight_gets_no_gradient_and_no_grad_mode_computes_none():
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(40, 8, generator=g, requires_grad=True), torch.randn(50, 8, generator=g)
    y = torch.randint(0, 50, (40,), generator=g)
    loss = linear_cross_entropy(h, w, y, chunk_size=16)  # w frozen (a LoRA run's head)
    (dh,) = torch.autograd.grad(loss, (h,))
    torch.testing.assert_close(dh, torch.autograd.grad(_torch_ce(h, w, y, 0, 0, "mean"), (h,))[0])
    with torch.no_grad():
        value = linear_cross_entropy(h, w, y)
    assert not value.requires_grad and torch.allclose(value, loss.detach())
    assert chunk_rows(49152) == 170 and chunk_rows(8192) == 1024 and chunk_rows(10**9) == 16


def test_all_ignored_mean_is_nan_like_torch_and_bad_input_is_named():
    h, w = torch.randn(4, 8), torch.randn(10, 8)
    assert torch.isnan(linear_cross_entropy(h, w, torch.full((4,), -100)))
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(h, w, torch.zeros(4, dtype=torch.long), reduction="none")
    with pytest.raises(ValueError, match="disagree"):
        linear_cross_entropy(h, w, torch.zeros(5, dtype=torch.long))


def test_under_bf16_autocast_it_matches_the_unfused_autocast_path():
    """Both run the head's matmuls in bf16; the chunked path sums dW's bf16 products in fp32 (closer to fp32)."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(64, 32, generator=g, requires_grad=True)
    w = (torch.randn(300, 32, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, 300, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.cross_entropy((h @ w.t()).float(), y)
        got = linear_cross_entropy(h, w, y, chunk_size=16)
    gh, gw = torch.autograd.grad(want, (h, w))
    dh, dw = torch.autograd.grad(got, (h, w))
    exact = F.cross_entropy(h @ w.t(), y)
    eh, ew = torch.autograd.grad(exact, (h, w))
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(dh, gh, rtol=0.05, atol=2e-4)
    torch.testing.assert_close(dw, gw, rtol=0.05, atol=2e-4)
    assert (dw - ew).abs().max() <= (gw - ew).abs().max() * 1.5  # no worse than the unfused bf16 path
    assert dh.dtype == h.dtype and dw.dtype == w.dtype


def _model(**overrides):
    torch.manual_seed(0)
    return TransformerLM(get_preset("llama-tiny", vocab_size=97, n_layers=2, **overrides)).train()


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "logits_scaling": 2.5}])
def test_model_loss_chunked_equals_the_logits_path_in_value_and_every_gradient(overrides):
    a = _model(**overrides)
    b = copy.deepcopy(a)
    ids = torch.randint(0, 97, (3, 20))
    y = torch.randint(0, 97, (3, 19))
    y[1, :4] = -100
    ref = model_cross_entropy(a, ids, y, "torch", label_smoothing=0.1, reduction="sum", drop_last=True)
    got = model_cross_entropy(b, ids, y, "chunked", label_smoothing=0.1, reduction="sum", drop_last=True)
    ref.backward()
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_lora_model_and_unfusable_heads():
    a = _model()
    apply_lora(a, ["q_proj", "v_proj"], r=2, alpha=4)
    with torch.no_grad():
        for m in a.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.weight.normal_()
    b = copy.deepcopy(a)
    ids, y = torch.randint(0, 97, (2, 12)), torch.randint(0, 97, (2, 12))
    model_cross_entropy(a, ids, y, "torch").backward()
    model_cross_entropy(b, ids, y, "chunked").backward()
    assert b.lm_head.weight.grad is None  # the frozen head: no dW computed
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert fused_head_weight(_model(final_softcap=30.0)) is None  # soft-capped logits: the torch path
    capped = _model(final_softcap=30.0)
    torch.testing.assert_close(model_cross_entropy(capped, ids, y, "chunked"), model_cross_entropy(capped, ids, y, "torch"))


def test_native_rows_under_bf16_autocast_equal_the_torch_rows():
    """fused=True with the native kernels: the bf16 chunk's loss and dx in one C++ pass (no fp32 copy); the same
    function as the torch rows of fused=False under the same autocast (the loss and both gradients)."""
    from scratchlm.kernels.build import native
    if native() is None:
        pytest.skip("no C++ compiler / SCRATCHLM_KERNELS=0: fused=True keeps the torch rows (tested above)")
    g = torch.Generator().manual_seed(3)
    h = torch.randn(70, 48, generator=g, requires_grad=True)
    w = (torch.randn(333, 48, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, 333, (70,), generator=g)
    y[:5] = -100
    out = {}
    for fused in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = linear_cross_entropy(h, w, y, label_smoothing=0.1, z_loss=1e-3, chunk_size=32, fused=fused)
        out[fused] = (loss, *torch.autograd.grad(loss, (h, w)))
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(out[True][1:], out[False][1:]):  # dx rounds to bf16 in both; a value may land one step away
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-4)
