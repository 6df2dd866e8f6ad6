"""RoPE scaling (nn/rope_scaling.py) against transformers' own ROPE_INIT_FUNCTIONS, and RotaryEmbedding's
per-forward choices (longrope short/long, dynamic NTK) against HF's rotary module."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from scratchlm.config import ModelConfig
from scratchlm.nn.rope import RotaryEmbedding
from scratchlm.nn.rope_scaling import dynamic_inv_freq, scaled_inv_freq

HD, CTX, L0 = 16, 128, 32
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": L0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0},
    "yarn_mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0, "mscale": 0.7,
                    "mscale_all_dim": 0.3, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    "yarn_attention_factor": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": L0,
                              "attention_factor": 1.3},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": L0,
                 "short_factor": [1.0 + 0.1 * i for i in range(HD // 2)],
                 "long_factor": [2.0 + 0.5 * i for i in range(HD // 2)]},
    "longrope_factor": {"rope_type": "longrope", "original_max_position_embeddings": L0, "factor": 6.0,
                        "short_factor": [1.0] * (HD // 2), "long_factor": [3.0] * (HD // 2)},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": CTX},
}


def hf_config(scaling: dict, base: float = 5000.0) -> LlamaConfig:
    params = {k: v for k, v in scaling.items()}
    if params["rope_type"] == "dynamic":
        params.pop("original_max_position_embeddings")  # HF's dynamic uses max_position_embeddings
    return LlamaConfig(hidden_size=4 * HD, num_attention_heads=4, head_dim=HD, max_position_embeddings=CTX,
                       rope_parameters={**params, "rope_theta": base})


@pytest.mark.parametrize("name", sorted(set(SCALINGS) - {"dynamic"}))
def test_static_frequencies_and_attention_factor_match_transformers(name):
    scaling = SCALINGS[name]
    for long in ((False, True) if scaling["rope_type"] == "longrope" else (False,)):
        inv, factor = scaled_inv_freq(HD, 5000.0, scaling, CTX, long=long)
        hf_inv, hf_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_config(scaling), "cpu",
                                                                      seq_len=L0 + 1 if long else None)
        torch.testing.assert_close(inv.float(), hf_inv, rtol=2e-6, atol=0)
        assert factor == pytest.approx(hf_factor, rel=1e-12)
    assert ModelConfig(d_model=64, n_heads=4, rope_scaling=scaling).rope_scaling == scaling  # a valid config field


@pytest.mark.parametrize("seq_len", [40, 128, 129, 200, 256])
def test_dynamic_ntk_frequencies_match_transformers(seq_len):
    scaling = SCALINGS["dynamic"]
    ours = dynamic_inv_freq(HD, 5000.0, scaling, torch.tensor(seq_len))
    theirs, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf_config(scaling), "cpu", seq_len=seq_len)
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=0)


@pytest.mark.parametrize("name,longest", [("longrope", 20), ("longrope", 60), ("dynamic", 100), ("dynamic", 230),
                                          ("yarn", 100), ("llama3", 127)])
def test_rotary_module_matches_hf_rotary_embedding_per_forward(name, longest):
    """Per forward, the longest position picks longrope's factors / dynamic's base, like HF's rotary module."""
    scaling = SCALINGS[name]
    hf_rope = LlamaRotaryEmbedding(hf_config(scaling))  # a fresh module: no growth state from earlier calls
    positions = torch.stack([torch.arange(longest - 12, longest), torch.arange(12)])  # (2, 12), two rows
    x = torch.randn(2, 3, 12, HD)
    cos, sin = hf_rope(x, positions)  # (B, T, Hd) with attention scaling
    expected = x * cos[:, None] + torch.cat((-x[..., HD // 2:], x[..., : HD // 2]), -1) * sin[:, None]
    table_len = 2 * CTX if name == "dynamic" else CTX  # longrope's default attention factor reads it
    for fused in (False, True):
        ours = RotaryEmbedding(HD, table_len, 5000.0, "half", fused=fused, scaling=scaling)(x, positions)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad,match", [
    ({"rope_type": "linear"}, r"missing \['factor'\]"),
    ({"rope_type": "ntk", "factor": 2.0}, r"\['rope_type'\]='ntk' is not one of"),
    ({"rope_type": "linear", "factor": 2.0, "alpha": 1}, r"unknown \['alpha'\]"),
    ({"rope_type": "linear", "factor": -1.0}, r"rope_scaling\['factor'\]=-1.0 must be a number > 0"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_position_embeddings": 8},
     "head_dim/2 = 8"),
    ({**SCALINGS["llama3"], "high_freq_factor": 0.5}, "high_freq_factor > low_freq_factor"),
])
def test_bad_scaling_names_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(d_model=64, n_heads=4, rope_scaling=bad)
