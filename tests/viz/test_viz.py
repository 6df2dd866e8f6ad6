"""Explanatory plots: RoPE decay bound vs brute-force complex sums; attention maps vs HF eager attentions."""

import cmath

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.viz.attention_maps import attention_probs, plot_attention
from scratchlm.viz.rope_decay import plot_rope_decay, rope_relative_upper_bound


def test_rope_bound_matches_brute_force_complex_sum() -> None:
    d, base = 16, 10000.0
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    for r in (0, 1, 5, 37, 200):
        partial, total = 0j, 0.0
        for j in range(d // 2):
            partial += cmath.exp(1j * r * theta[j])
            total += abs(partial)
        assert rope_relative_upper_bound(torch.tensor([r]), d, base).item() == pytest.approx(total / (d / 2), rel=1e-5)  # theta in fp32


def test_rope_bound_decays_with_distance() -> None:
    bound = rope_relative_upper_bound(torch.arange(0, 257), 128, 10000.0)
    assert bound[0].item() == pytest.approx((64 + 1) / 2)  # r = 0: |S_j| = j, mean over j = (d/2 + 1) / 2
    assert bound[200:].max() < 0.5 * bound[0]  # RoFormer fig. 2: long-term decay


def test_rope_decay_plot_is_a_png(tmp_path) -> None:
    out = plot_rope_decay(tmp_path / "rope.png", max_distance=64)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_probs_match_hf_eager_attentions(tmp_path) -> None:
    c = get_preset("llama-tiny", vocab_size=100, n_layers=2)
    model = TransformerLM(c).eval()
    hf_cfg = LlamaConfig(
        vocab_size=100, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=2,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps, tie_word_embeddings=True, attn_implementation="eager",
    )
    hf = LlamaForCausalLM(hf_cfg).eval()
    hf.load_state_dict(model.state_dict(), strict=False)
    ids = torch.randint(0, 100, (2, 9))
    ours = attention_probs(model, ids)
    with torch.no_grad():
        ref = hf(ids, output_attentions=True).attentions
    assert len(ours) == 2
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    out = plot_attention(ours, [str(i) for i in ids[0].tolist()], tmp_path / "attn.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
