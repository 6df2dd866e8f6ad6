"""nn/probs_attention.py: causal bf16 attention with the probabilities materialised (sdpa_attention's training path).

References, all built from torch ops here: torch.softmax over the masked fp32 scores rounded by .to(bfloat16)
(the C++ softmax and its gradient), and float64 attention of the same bf16 inputs (the whole function, values and
gradients), with torch's own flash kernel (F.scaled_dot_product_attention in bf16) as the peer whose error ours
must stay within.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import probs_attention as pa
from scratchlm.nn.attention import Attention


def causal(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of the last place of bf16 at b (a and b bf16)."""
    ulp = torch.finfo(torch.bfloat16).eps * b.float().abs().clamp_min(torch.finfo(torch.float32).tiny)
    return (a.float() - b.float()).abs() / ulp


@pytest.mark.parametrize("t", [1, 7, 64, 200])
def test_causal_softmax_is_torch_softmax_rounded_to_bf16(kernels, t: int) -> None:
    g = torch.Generator().manual_seed(t)
    s = torch.randn(3, 2 * t, t, generator=g) * 6  # 2 query groups of t rows each (GQA rows)
    scale = 0.125
    got = pa.causal_softmax(s, scale)
    mask = causal(t).repeat(2, 1)  # row r sees keys <= r % t
    want = torch.softmax((s * scale).masked_fill(~mask, float("-inf")), dim=-1).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == s.shape
    assert bool((got[:, ~mask] == 0).all())  # exactly zero above the diagonal
    ulps = bf16_ulps(got, want)[:, mask]
    assert float(ulps.max()) <= 1.0  # the exps are within 2 fp32 ulp: a bf16 rounding may land one step away
    assert float((ulps == 0).float().mean()) > 0.98


@pytest.mark.parametrize("t", [5, 130])
def test_causal_softmax_grad_is_torch_formula_rounded(kernels, t: int) -> None:
    g = torch.Generator().manual_seed(t)
    p = torch.softmax(torch.randn(4, t, t, generator=g).masked_fill(~causal(t), float("-inf")), -1).to(torch.bfloat16)
    dp = torch.randn(4, t, t, generator=g)
    d = torch.randn(4, t, generator=g)
    got = pa.causal_softmax_grad(p, dp, d, 0.3)
    want = (p.float() * (dp - d[..., None]) * 0.3).masked_fill(~causal(t), 0.0).to(torch.bfloat16)
    # one fp32 rounding apart (the product order): at most one bf16 step, nearly always none
    assert float(bf16_ulps(got, want)[:, causal(t)].max()) <= 1.0
    assert bool((got[:, ~causal(t)] == 0).all())
    assert float((got == want).float().mean()) > 0.99


def reference(q, k, v, do, scale):
    """float64 causal attention of the same (bf16) inputs: output and gradients."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = (q64 @ k64.repeat_interleave(g, 1).transpose(-1, -2)) * scale
    t = q.shape[-2]
    o = torch.softmax(s.masked_fill(~causal(t), float("-inf")), -1) @ v64.repeat_interleave(g, 1)
    o.backward(do.double())
    return o.detach(), q64.grad, k64.grad, v64.grad


def run(fn, q, k, v, do):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o = fn(q, k, v)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


@pytest.fixture(params=["fused scores", "fp32 GEMM scores"])
def scores_path(request, kernels, monkeypatch):
    """Both ways to the scores: fused bf16 dot products (AVX512-BF16 CPUs) and fp32 GEMMs + the softmax kernel."""
    if request.param == "fused scores":
        if not kernels.has_bf16_dot():
            pytest.skip("this CPU has no AVX512-BF16: the fp32 GEMM scores run (the other parameter)")
    else:
        monkeypatch.setattr(pa, "bf16_dot_ready", lambda: False)
    return request.param


def test_fused_scores_equal_fp32_gemm_scores_then_softmax(kernels) -> None:
    """causal_probs / causal_probs_grad (scores by bf16 dot products inside the row pass) against the GEMM route:
    fp32 products of the same bf16 values, then causal_softmax / causal_softmax_grad. Same fp32 function up to
    summation order: the bf16 outputs agree but for a rare one-step rounding."""
    if not kernels.has_bf16_dot():
        pytest.skip("this CPU has no AVX512-BF16 (causal_probs_bf16 is not built)")
    g = torch.Generator().manual_seed(5)
    n, t, gq, hd = 3, 50, 2, 48  # 50 keys: a partial 16-key block; 2 query groups
    q = (torch.randn(n, gq * t, hd, generator=g) * 2).bfloat16()
    k = (torch.randn(n, t, hd, generator=g) * 2).bfloat16()
    v, dout = torch.randn(n, t, hd, generator=g).bfloat16(), torch.randn(n, gq * t, hd, generator=g).bfloat16()
    p = pa.causal_probs(q, k, 0.2)
    want = pa.causal_softmax(q.float() @ k.float().transpose(-1, -2), 0.2)
    assert float(bf16_ulps(p, want)[want != 0].max()) <= 1.0 and bool((p[want == 0] == 0).all())
    assert float((p == want).float().mean()) > 0.99
    d = torch.randn(n, gq * t, generator=g)
    ds = pa.causal_probs_grad(p, dout, v, d, 0.2)
    want = pa.causal_softmax_grad(p, dout.float() @ v.float().transpose(-1, -2), d, 0.2)
    assert float(((ds.float() - want.float()).abs() / want.float().abs().clamp_min(1e-30))[want != 0].max()) < 0.05
    assert float((ds == want).float().mean()) > 0.98


@pytest.mark.parametrize("h,kvh", [(6, 2), (4, 4), (4, 1)])
def test_values_and_gradients_against_float64_within_torch_flash_error(scores_path, h: int, kvh: int) -> None:
    g = torch.Generator().manual_seed(h * 10 + kvh)
    b, t, hd = 2, 96, 32
    q = (torch.randn(b, h, t, hd, generator=g) * 2).bfloat16()
    k = (torch.randn(b, kvh, t, hd, generator=g) * 2).bfloat16()
    v = torch.randn(b, kvh, t, hd, generator=g).bfloat16()
    do = torch.randn(b, h, t, hd, generator=g).bfloat16()
    scale = hd ** -0.5
    assert pa.applies(q, k, v, None, True, None)
    ours = run(lambda q, k, v: pa.probs_attention(q, k, v, scale), q, k, v, do)
    flash = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                               enable_gqa=h != kvh), q, k, v, do)
    want = reference(q, k, v, do, scale)
    for name, a, f, w in zip(("out", "dq", "dk", "dv"), ours, flash, want):
        assert a.dtype == torch.bfloat16 and a.shape == w.shape, name
        err, err_flash = float((a.double() - w).abs().max()), float((f.double() - w).abs().max())
        assert err <= 2 * err_flash + 1e-3 * float(w.abs().max()), (name, err, err_flash)


def test_applies_only_where_the_function_is_the_same(kernels) -> None:
    q, k, v = torch.zeros(1, 4, 8, 16, dtype=torch.bfloat16), torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16), \
        torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)
    assert pa.applies(q, k, v, None, True, None)
    assert not pa.applies(q.float(), k.float(), v.float(), None, True, None)  # fp32 keeps torch's kernel
    assert not pa.applies(q, k, v, causal(8), True, None)  # an extra mask
    assert not pa.applies(q, k, v, None, False, None)  # not causal
    assert not pa.applies(q, k, v, None, True, 30.0)  # soft-capping
    assert not pa.applies(q, torch.zeros(1, 2, 12, 16, dtype=torch.bfloat16),
                          torch.zeros(1, 2, 12, 16, dtype=torch.bfloat16), None, True, None)  # cached keys: T != S
    big = torch.zeros(1, 1, 8192, 2, dtype=torch.bfloat16)  # 64M scores: over SCORE_BUDGET
    assert not pa.applies(big, big, big, None, True, None)


def test_attention_module_under_autocast_matches_reference_impl(kernels, monkeypatch) -> None:
    """Attention(attn_impl="sdpa") in a bf16 autocast step takes this path; same output and weight gradients as
    attn_impl="reference" (torch ops: scores, masked softmax, products) within bf16 rounding."""
    calls = []
    monkeypatch.setattr("scratchlm.nn.attention.probs_attention",
                        lambda *a: calls.append(1) or pa.probs_attention(*a))
    torch.manual_seed(0)
    mods = {impl: Attention(64, 4, n_kv_heads=2, attn_impl=impl) for impl in ("sdpa", "reference")}
    mods["reference"].load_state_dict(mods["sdpa"].state_dict())
    x = torch.randn(2, 40, 64)
    outs, grads = {}, {}
    for impl, m in mods.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        y.float().square().mean().backward()
        outs[impl], grads[impl] = y.detach().float(), m.q_proj.weight.grad.clone()
    assert calls == [1]  # the sdpa module only
    scale = float(outs["reference"].abs().max())
    assert float((outs["sdpa"] - outs["reference"]).abs().max()) <= 2e-2 * scale
    gscale = float(grads["reference"].abs().max())
    assert float((grads["sdpa"] - grads["reference"]).abs().max()) <= 3e-2 * gscale


def test_compiled_attention_keeps_the_path_in_one_graph(kernels) -> None:
    """torch.compile traces the availability checks without loading anything (native_ready) and the path's ops as
    custom ops: one graph, no break, the eager values."""
    import torch._dynamo

    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, 32, 16, generator=g).bfloat16()
    k, v = torch.randn(1, 2, 32, 16, generator=g).bfloat16(), torch.randn(1, 2, 32, 16, generator=g).bfloat16()

    def f(q, k, v):
        assert pa.applies(q, k, v, None, True, None)
        return pa.probs_attention(q, k, v, 0.25)

    explained = torch._dynamo.explain(f)(q, k, v)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    torch.testing.assert_close(torch.compile(f)(q, k, v), f(q, k, v))
