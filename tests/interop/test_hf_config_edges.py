"""config.json edge cases follow transformers: each edited checkpoint is loaded by HF and by scratchlm and
the two must agree (never a silently different model)."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import build_hf, random_ids
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import scratchlm


def _edit(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    path.write_text(json.dumps(config))
    return directory


def _agree(directory):
    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    ours = scratchlm.from_pretrained(directory)
    ids = random_ids(length=30)
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    return hf, ours


@pytest.mark.parametrize("changes,theta", [
    # rope_parameters' own theta wins over a disagreeing top-level rope_theta
    (dict(rope_theta=500.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), 10000.0),
    # a rope_parameters dict without theta takes the top-level one
    (dict(rope_theta=500.0, rope_parameters={"rope_type": "default"}), 500.0),
    # the old rope_scaling key wins over rope_parameters
    (dict(rope_theta=700.0, rope_scaling={"rope_type": "linear", "factor": 2.0},
          rope_parameters={"rope_type": "default", "rope_theta": 1e4}), 700.0),
    # no RoPE settings at all: the family default (10000 for llama)
    (dict(rope_theta=None, rope_parameters=None), 10000.0),
    # hidden_act aliases of silu, and keys a rope type does not use (HF ignores them)
    (dict(hidden_act="swish", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "factor": 3.0}), 1e4),
])
def test_rope_theta_priority_matches_transformers(tmp_path, changes, theta):
    build_hf("llama_untied_gqa").save_pretrained(tmp_path)
    _, ours = _agree(_edit(tmp_path, **changes))
    assert ours.config.rope_base == theta


@pytest.mark.parametrize("same", [True, False])
def test_tied_config_with_a_stored_head(tmp_path, same):
    """tie_word_embeddings=true plus a stored lm_head.weight: HF ties only if the head equals the embedding."""
    build_hf("llama_tied_gqa").save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(str(path))
    embed = state["model.embed_tokens.weight"]
    state["lm_head.weight"] = embed.clone() if same else torch.randn_like(embed)
    save_file(state, str(path), metadata={"format": "pt"})
    if same:
        hf, ours = _agree(tmp_path)
    else:
        with pytest.warns(UserWarning, match="loading it untied"):
            hf, ours = _agree(tmp_path)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == same
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == same
    assert torch.equal(ours.lm_head.weight, state["lm_head.weight"])


def test_llama_with_a_sliding_window_is_refused(tmp_path):
    """LlamaModel's forward ignores sliding_window but generate()'s cache applies it: no single model to match."""
    build_hf("llama_untied_gqa").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="sliding_window=4 .*generate"):
        scratchlm.from_pretrained(_edit(tmp_path, sliding_window=4))
    _agree(_edit(tmp_path, sliding_window=None, use_sliding_window=True, max_window_layers=1))  # no window: fine
