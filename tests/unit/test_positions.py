"""Sinusoidal, learned and rotary positions.

References: sinusoidal vs the paper's formula evaluated with Python's math; RoPE "half" vs HF
transformers' Llama rotary embedding; "interleaved" vs the complex-number form; properties with
hypothesis (relative-position dependence, interleaved == half under a fixed permutation)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from scratchlm.nn import LearnedPositions, RotaryEmbedding, SinusoidalPositions
from scratchlm.nn.rope import apply_rope_complex, interleaved_to_half_permutation, rope_angles, rope_inv_freq


def test_sinusoidal_matches_paper_formula() -> None:
    d, n = 8, 50
    pe = SinusoidalPositions(n, d)
    pos = torch.tensor([0, 1, 7, 49])
    out = pe(pos)
    for r, p in enumerate(pos.tolist()):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert out[r, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert out[r, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert "table" not in pe.state_dict()  # non-persistent buffer


def test_learned_positions_lookup_and_bounds() -> None:
    pe = LearnedPositions(10, 4)
    torch.testing.assert_close(pe(torch.tensor([3, 9])), pe.weight[[3, 9]])
    with pytest.raises(ValueError, match=r"position 10 is outside the position table \[0, 10\)"):
        pe(torch.tensor([10]))


def test_rope_inverse_frequencies() -> None:
    # theta_i = base^(-2i/d). Seed bug: base ** -(i) / d (operator precedence) or base ** (-i/d).
    d, base = 16, 10000.0
    expected = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)])
    torch.testing.assert_close(rope_inv_freq(d, base), expected, rtol=1e-6, atol=0)
    wrong_precedence = torch.tensor([base ** -i / d for i in range(d // 2)])
    wrong_exponent = torch.tensor([base ** (-i / d) for i in range(d // 2)])
    assert not torch.allclose(wrong_precedence, expected, rtol=1e-3)
    assert not torch.allclose(wrong_exponent, expected, rtol=1e-3)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_half_matches_hf_llama(base: float) -> None:
    b, h, t, hd = 2, 3, 11, 16
    cfg = LlamaConfig(hidden_size=h * hd, num_attention_heads=h, max_position_embeddings=64, rope_theta=base)
    hf_rope = LlamaRotaryEmbedding(cfg)
    q, k = torch.randn(b, h, t, hd), torch.randn(b, h, t, hd)
    pos = torch.stack([torch.arange(t), torch.arange(5, 5 + t)])  # (B, T) per-row positions
    cos, sin = hf_rope(q, pos)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    ours = RotaryEmbedding(hd, 64, base=base, style="half")
    torch.testing.assert_close(ours(q, pos), q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(k, pos), k_ref, rtol=1e-5, atol=1e-5)
    assert not any(n in ours.state_dict() for n in ("cos", "sin"))  # non-persistent tables


def test_rope_interleaved_matches_complex_form() -> None:
    hd, t = 12, 9
    x = torch.randn(2, 3, t, hd)
    pos = torch.arange(t)
    ours = RotaryEmbedding(hd, 32, style="interleaved")(x, pos)
    ref = apply_rope_complex(x, rope_angles(32, hd, 10000.0)[pos])
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60), st.integers(0, 40), st.sampled_from(["half", "interleaved"]))
def test_rope_score_depends_only_on_relative_position(m: int, n: int, shift: int, style: str) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n)
    q, k = torch.randn(1, 1, 1, 32, generator=g), torch.randn(1, 1, 1, 32, generator=g)
    rope = RotaryEmbedding(32, 128, style=style)

    def score(a: int, b_: int) -> float:
        return float((rope(q, torch.tensor([a])) * rope(k, torch.tensor([b_]))).sum())

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-4)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8).map(lambda x: 2 * x), st.lists(st.integers(0, 63), min_size=1, max_size=6))
def test_interleaved_equals_half_under_permutation(hd: int, positions: list[int]) -> None:
    perm = interleaved_to_half_permutation(hd)
    x = torch.randn(1, 2, len(positions), hd)
    pos = torch.tensor(positions)
    inter = RotaryEmbedding(hd, 64, style="interleaved")(x, pos)
    half = RotaryEmbedding(hd, 64, style="half")(x[..., perm], pos)
    torch.testing.assert_close(inter[..., perm], half, rtol=1e-5, atol=1e-5)


def test_rope_errors() -> None:
    with pytest.raises(ValueError, match="even head_dim"):
        RotaryEmbedding(7, 16)
    with pytest.raises(ValueError, match="unknown rope style"):
        RotaryEmbedding(8, 16, style="neox")
    rope = RotaryEmbedding(8, 16)
    with pytest.raises(ValueError, match=r"position 16 is outside the position table \[0, 16\)"):
        rope(torch.randn(1, 1, 2, 8), torch.tensor([15, 16]))
