"""Attention: reference SDPA vs F.scaled_dot_product_attention (masks, GQA, grads); the fast path;
MHA/GQA/MQA equivalences; seed bugs (inverted mask, RoPE before splitting heads)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchlm.nn import Attention, RotaryEmbedding, scaled_dot_product_attention, sdpa_attention
from scratchlm.nn.masks import causal_mask, padding_to_attention_mask


def _qkv(b=2, h=4, kvh=4, t=7, s=7, hd=8):
    return torch.randn(b, h, t, hd), torch.randn(b, kvh, s, hd), torch.randn(b, kvh, s, hd)


@pytest.mark.parametrize("kvh", [4, 2, 1])
@pytest.mark.parametrize("masking", ["none", "causal", "padding"])
def test_reference_attention_matches_torch(kvh: int, masking: str) -> None:
    q, k, v = _qkv(kvh=kvh)
    mask, is_causal = None, masking == "causal"
    if masking == "padding":
        keep = torch.ones(2, 7, dtype=torch.bool)
        keep[0, :3] = False  # left padding in row 0
        mask = padding_to_attention_mask(keep) & causal_mask(7, 7)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = scaled_dot_product_attention(*leaves, mask=mask, is_causal=is_causal)
    ref = F.scaled_dot_product_attention(*refs, attn_mask=mask, is_causal=is_causal, enable_gqa=kvh != 4)
    live = torch.ones(2, 1, 7, 1) if mask is None else mask.expand(2, 1, 7, 7).any(-1, keepdim=True).float()
    torch.testing.assert_close(out * live, torch.nan_to_num(ref) * live, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out) * live
    out.backward(g)
    torch.nan_to_num(ref).backward(g)
    for a, b_ in zip(leaves, refs):
        torch.testing.assert_close(a.grad, torch.nan_to_num(b_.grad), rtol=1e-4, atol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan() -> None:
    q, k, v = _qkv(kvh=2)
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    mask[1, :, 2] = False  # row 2 of batch 1 sees nothing
    for impl in (scaled_dot_product_attention, sdpa_attention):
        out = impl(q, k, v, mask=mask)
        assert torch.isfinite(out).all()
        assert torch.equal(out[1, :, 2], torch.zeros(4, 8))


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from([(4, 4), (4, 2), (6, 1)]), st.integers(1, 9), st.integers(0, 4), st.booleans(), st.booleans()
)
def test_sdpa_fast_path_equals_reference(heads, t, extra, causal, use_mask) -> None:
    h, kvh = heads
    s = t + extra
    q, k, v = _qkv(h=h, kvh=kvh, t=t, s=s)
    mask = torch.rand(2, 1, t, s) > 0.3 if use_mask else None
    ref = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=causal)
    fast = sdpa_attention(q, k, v, mask=mask, is_causal=causal)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)


def test_inverted_mask_polarity_is_caught() -> None:
    # Seed bug: True meaning "masked out". Our convention: True = may attend.
    q, k, v = _qkv()
    mask = causal_mask(7, 7)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=mask), ref, rtol=1e-5, atol=1e-5)
    inverted = scaled_dot_product_attention(q, k, v, mask=~mask)
    assert (torch.nan_to_num(inverted) - ref).abs().max() > 0.1


def _attn(h: int, kvh: int, **kw) -> Attention:
    return Attention(32, h, kvh, rope=RotaryEmbedding(32 // h, 64), **kw)


@pytest.mark.parametrize("impl", ["reference", "sdpa"])
def test_mha_equals_gqa_with_shared_kv_weights(impl: str) -> None:
    """GQA(n_kv=2) equals MHA(n_kv=4) whose K/V rows repeat each kv head for its query group."""
    torch.manual_seed(1)
    gqa, mha = _attn(4, 2, attn_impl=impl), _attn(4, 4, attn_impl=impl)
    hd = 8
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(gqa, name).weight.view(2, hd, 32)  # (KvH, Hd, D)
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(4 * hd, 32))
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(gqa(x), mha(x), rtol=1e-5, atol=1e-5)


def test_mqa_equals_mha_with_one_kv_head_repeated() -> None:
    mqa, mha = _attn(4, 1), _attn(4, 4)
    with torch.no_grad():
        mha.q_proj.weight.copy_(mqa.q_proj.weight)
        mha.o_proj.weight.copy_(mqa.o_proj.weight)
        mha.k_proj.weight.copy_(mqa.k_proj.weight.repeat(4, 1))
        mha.v_proj.weight.copy_(mqa.v_proj.weight.repeat(4, 1))
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(mqa(x), mha(x), rtol=1e-5, atol=1e-5)


def _rotate_half_rope(z: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """HF-style RoPE on the last dim of z (..., T, d): z*cos + rotate_half(z)*sin."""
    d, t = z.shape[-1], z.shape[-2]
    inv = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
    ang = torch.outer(torch.arange(t).float(), inv)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    return z * cos + torch.cat([-z[..., d // 2:], z[..., : d // 2]], -1) * sin


def _manual_attention(attn: Attention, x: torch.Tensor, rope_before_split: bool = False) -> torch.Tensor:
    """Independent re-derivation with torch ops: per-head RoPE (HF rotate_half form), F.sdpa."""
    b, t, _ = x.shape
    h, kvh, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias)
    k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias)
    v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias)
    if rope_before_split:  # seed bug: rotating the whole (H*Hd) projection as one vector
        q, k = _rotate_half_rope(q), _rotate_half_rope(k)
    q = q.view(b, t, h, hd).transpose(1, 2)  # (B, H, T, Hd)
    k = k.view(b, t, kvh, hd).transpose(1, 2)
    v = v.view(b, t, kvh, hd).transpose(1, 2)
    if attn.q_norm is not None:
        q = F.rms_norm(q, (hd,), attn.q_norm.weight, attn.q_norm.eps)
        k = F.rms_norm(k, (hd,), attn.k_norm.weight, attn.k_norm.eps)
    if not rope_before_split:
        q, k = _rotate_half_rope(q), _rotate_half_rope(k)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kvh != h)
    return F.linear(out.transpose(1, 2).reshape(b, t, h * hd), attn.o_proj.weight, attn.o_proj.bias)


@pytest.mark.parametrize("qkv_bias, qk_norm", [(False, False), (True, False), (False, True)])
def test_attention_module_matches_manual_torch(qkv_bias: bool, qk_norm: bool) -> None:
    attn = _attn(4, 2, qkv_bias=qkv_bias, qk_norm=qk_norm)
    with torch.no_grad():
        if qk_norm:
            attn.q_norm.weight.normal_()
            attn.k_norm.weight.normal_()
    x = torch.randn(2, 10, 32)
    torch.testing.assert_close(attn(x), _manual_attention(attn, x), rtol=1e-5, atol=1e-5)


def test_rope_before_splitting_heads_is_caught() -> None:
    attn = _attn(4, 4)
    x = torch.randn(1, 10, 32)
    buggy = _manual_attention(attn, x, rope_before_split=True)
    assert (attn(x) - buggy).abs().max() > 1e-3


def test_attention_config_errors() -> None:
    with pytest.raises(ValueError, match="d_model=30 must be divisible by n_heads=4"):
        Attention(30, 4)
    with pytest.raises(ValueError, match="n_heads=4 must be divisible by n_kv_heads=3"):
        Attention(32, 4, 3)
    with pytest.raises(ValueError, match="unknown attn_impl"):
        Attention(32, 4, attn_impl="flash")
