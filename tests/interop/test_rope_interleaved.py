"""Exporting an "interleaved"-RoPE model: HF pairs channels "half"-style, so q/k rows are permuted."""

from __future__ import annotations

import json

import torch
from interop_helpers import hf_logits, random_ids, randomize_
from transformers import AutoModelForCausalLM

import scratchlm
from scratchlm.config import get_preset
from scratchlm.interop.hf.config_json import HINT_KEY
from scratchlm.model import TransformerLM


def _interleaved_model(**overrides) -> TransformerLM:
    config = get_preset("llama-tiny", vocab_size=96, d_model=64, n_layers=2, max_seq_len=64,
                        rope_style="interleaved", **overrides)
    return randomize_(TransformerLM(config), seed=11)


def test_interleaved_export_matches_hf_logits(tmp_path):
    ours = _interleaved_model(qkv_bias=True, qk_norm=True)  # q/k biases and q_norm/k_norm gains permuted too
    directory = scratchlm.save_pretrained(ours, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = random_ids(length=40)
    with torch.no_grad():
        assert (ours(ids) - hf_logits(hf, ids)).abs().max().item() <= 1e-4
    # the exported rows really are permuted (HF would be wrong without it)
    raw = ours.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(hf.state_dict()["model.layers.0.self_attn.q_proj.weight"], raw)


def test_interleaved_round_trip_is_exact(tmp_path):
    ours = _interleaved_model()
    back = scratchlm.from_pretrained(scratchlm.save_pretrained(ours, tmp_path / "hf"))
    assert back.config.rope_style == "interleaved"
    for name, tensor in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_hf_dir_loads_as_half_or_interleaved_with_equal_logits(tmp_path):
    directory = scratchlm.save_pretrained(_interleaved_model(), tmp_path / "hf")
    config = json.loads((directory / "config.json").read_text())
    del config[HINT_KEY]  # a plain HF checkpoint: no scratchlm hint
    (directory / "config.json").write_text(json.dumps(config))
    half = scratchlm.from_pretrained(directory)
    interleaved = scratchlm.from_pretrained(directory, rope_style="interleaved")
    assert half.config.rope_style == "half" and interleaved.config.rope_style == "interleaved"
    ids = random_ids(length=40)
    with torch.no_grad():
        assert (half(ids) - interleaved(ids)).abs().max().item() <= 1e-4
