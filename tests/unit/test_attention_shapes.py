"""Attention functions take any number of leading batch dims (..., T, Hd) on both paths, equal to torch's
F.scaled_dot_product_attention; the Attention module and both functions reject other shapes by name."""

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import Attention, RotaryEmbedding, scaled_dot_product_attention, sdpa_attention
from scratchlm.nn.masks import causal_mask

IMPLS = [scaled_dot_product_attention, sdpa_attention]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lead, h, kvh", [((), None, None), ((3,), None, None), ((2,), 4, 2), ((2, 3), 4, 1),
                                          ((2, 1, 3), 2, 2)])
def test_any_leading_dims_match_torch(impl, lead, h, kvh):
    heads_q = () if h is None else (h,)
    heads_kv = () if kvh is None else (kvh,)
    q = torch.randn(*lead, *heads_q, 5, 8)
    k, v = torch.randn(*lead, *heads_kv, 7, 8), torch.randn(*lead, *heads_kv, 7, 6)
    mask = causal_mask(5, 7, start=2) & (torch.rand(5, 7) > 0.2)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~mask.any(-1, keepdim=True),
                                         enable_gqa=h is not None and h != kvh)
    ref = ref * mask.any(-1, keepdim=True)
    torch.testing.assert_close(impl(q, k, v, mask=mask), ref, rtol=1e-5, atol=1e-5)
    t = torch.randn(*lead, *heads_q, 7, 8)  # causal with T == S against torch's is_causal
    torch.testing.assert_close(impl(t, k, k, is_causal=True),
                               F.scaled_dot_product_attention(t, k, k, is_causal=True,
                                                              enable_gqa=h is not None and h != kvh),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q, k, v, mask, pattern", [
    ((8,), (8,), (8,), None, "same number of dims"),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7), None, "same number of dims"),
    ((2, 4, 5, 8), (2, 2, 7, 6), (2, 2, 7, 6), None, "share Hd"),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 6, 8), None, r"share \(..., KvH, S\)"),
    ((2, 4, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), None, "multiple of kv heads"),
    ((2, 4, 5, 8), (3, 4, 7, 8), (3, 4, 7, 8), None, "equal leading dims"),
    ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), (5, 6), r"does not broadcast to the scores' \(..., H, T, S\)"),
])
def test_bad_shapes_are_named(impl, q, k, v, mask, pattern):
    m = None if mask is None else torch.ones(mask, dtype=torch.bool)
    with pytest.raises(ValueError, match=pattern):
        impl(torch.randn(q), torch.randn(k), torch.randn(v), mask=m)


def test_float_masks_are_refused():
    q = torch.randn(1, 2, 3, 4)
    for impl in IMPLS:
        with pytest.raises(ValueError, match="masks are boolean"):
            impl(q, q, q, mask=torch.zeros(3, 3))


@pytest.mark.parametrize("shape, positions, pattern", [
    ((2, 5), None, r"expects x of shape \(B, T, D=32\), got \(2, 5\)"),
    ((1, 2, 5, 32), None, r"expects x of shape \(B, T, D=32\), got \(1, 2, 5, 32\)"),
    ((2, 5, 30), None, r"D=32\), got \(2, 5, 30\)"),
    ((2, 5, 32), (4,), r"positions must have shape \(T,\) = \(5,\) or \(B, T\) = \(2, 5\), got \(4,\)"),
    ((2, 5, 32), (5, 2), r"got \(5, 2\)"),
])
def test_attention_module_rejects_bad_input_by_name(shape, positions, pattern):
    attn = Attention(32, 4, 2, rope=RotaryEmbedding(8, 16))
    pos = None if positions is None else torch.zeros(positions, dtype=torch.long)
    with pytest.raises(ValueError, match=pattern):
        attn(torch.randn(shape), positions=pos)


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_model_rejects_wrong_shape_positions_for_every_position_kind(preset):
    from scratchlm.config import get_preset
    from scratchlm.model import TransformerLM

    model = TransformerLM(get_preset(preset, n_layers=1))
    x = torch.randint(0, 100, (2, 5))
    for shape in ((4,), (5, 2), (2, 5, 1)):
        with pytest.raises(ValueError, match=rf"positions must have shape \(T,\) = \(5,\) or \(B, T\) = \(2, 5\)"):
            model(x, token_positions=torch.zeros(shape, dtype=torch.long))
    torch.testing.assert_close(model(x, token_positions=torch.arange(5).expand(2, 5)), model(x))
