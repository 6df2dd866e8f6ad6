"""A causal chunk over a cached prefix as two unmasked attention calls merged by their log-sum-exp
(nn/chunk_attention.py), against torch's masked attention with the bottom-right causal mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import sdpa_attention
from scratchlm.nn.chunk_attention import causal_chunk_attention, chunk_attention_applies
from scratchlm.nn.masks import layer_mask


def _qkv(b: int, h: int, kvh: int, t: int, s: int, hd: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, hd, generator=g).to(dtype)
    k = torch.randn(b, kvh, s, hd, generator=g).to(dtype)
    v = torch.randn(b, kvh, s, hd, generator=g).to(dtype)
    return q, k, v


def _torch_reference(q, k, v, scale=None):
    """torch's own attention with the explicit mask: query i of T sees keys 0 .. S - T + i."""
    t, s = q.shape[-2], k.shape[-2]
    mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
    g = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(q.float(), kr.float(), vr.float(), attn_mask=mask, scale=scale)


@pytest.mark.parametrize("h,kvh", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("t,s", [(2, 3), (5, 12), (16, 100), (37, 300)])
def test_chunk_attention_equals_masked_attention(h, kvh, t, s) -> None:
    q, k, v = _qkv(2, h, kvh, t, s, 16)
    assert chunk_attention_applies(q, k)
    out = causal_chunk_attention(q, k, v)
    torch.testing.assert_close(out, _torch_reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_chunk_attention_scale_and_bf16() -> None:
    q, k, v = _qkv(1, 6, 3, 9, 40, 32)
    torch.testing.assert_close(causal_chunk_attention(q, k, v, scale=0.07), _torch_reference(q, k, v, 0.07),
                               rtol=1e-5, atol=1e-5)
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    out = causal_chunk_attention(qb, kb, vb)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _torch_reference(qb, kb, vb), rtol=2e-2, atol=2e-2)


def test_chunk_attention_applies_only_where_it_is_the_same_function() -> None:
    q, k, _ = _qkv(1, 4, 2, 5, 12, 8)
    assert chunk_attention_applies(q, k)
    assert not chunk_attention_applies(q[:, :, :1], k)  # one query: nothing to split
    assert not chunk_attention_applies(q, k[:, :, :5])  # T == S: the plain causal kernel
    assert not chunk_attention_applies(q.double(), k.double())
    assert not chunk_attention_applies(q.clone().requires_grad_(), k)  # training wants the autograd path
    with torch.no_grad():
        assert chunk_attention_applies(q.clone().requires_grad_(), k)


@pytest.mark.parametrize("grad", [False, True])
def test_sdpa_causal_chunk_equals_torch(grad) -> None:
    """sdpa_attention's is_causal with T < S (bottom-right) takes the split without grad, the mask with it."""
    q, k, v = _qkv(2, 6, 2, 7, 30, 16)
    if grad:
        q.requires_grad_()
    out = sdpa_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, _torch_reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_layer_mask_drops_a_padding_mask_that_hides_nothing() -> None:
    keep = torch.ones(2, 12, dtype=torch.bool)
    assert layer_mask(4, 12, 8, keep, None, torch.device("cpu")) == (None, True)
    assert layer_mask(1, 12, 11, None, None, torch.device("cpu")) == (None, False)
    pad = keep.clone()
    pad[0, :3] = False
    mask, causal = layer_mask(4, 12, 8, pad, None, torch.device("cpu"))
    expected = torch.ones(4, 12, dtype=torch.bool).tril(diagonal=8)[None, None] & pad[:, None, None, :]
    assert not causal and torch.equal(mask, expected)
