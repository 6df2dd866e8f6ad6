"""Parity with HF transformers (models built locally, random weights): logits, greedy generation, round trips."""

from __future__ import annotations

import pytest
import torch
from family_evidence import check_save
from interop_helpers import (FAMILIES, build_hf, hf_greedy, hf_logits, random_ids, randomize_,
                             safetensors_state, save_hf)
from transformers import AutoModelForCausalLM

import scratchlm
from scratchlm.generate.engine import generate
from scratchlm.interop.hf.config_json import config_from_hf
from scratchlm.model import TransformerLM

LOGIT_TOL = 1e-4  # fp32, max |diff|


@pytest.fixture(params=sorted(FAMILIES))
def hf_pair(request, tmp_path):
    """(family, HF model, HF dir, our model loaded from that dir)."""
    hf = build_hf(request.param)
    directory = save_hf(hf, tmp_path / "hf")
    return request.param, hf, directory, scratchlm.from_pretrained(directory)


def test_logits_match_hf(hf_pair):
    _, hf, _, ours = hf_pair
    ids = random_ids()
    with torch.no_grad():
        diff = (ours(ids) - hf_logits(hf, ids)).abs().max().item()
    assert diff <= LOGIT_TOL


@pytest.mark.parametrize("fast", [{"attn_impl": "sdpa"}, {"attn_impl": "sdpa", "ops_impl": "fused"}])
def test_sdpa_fast_path_matches_hf(hf_pair, fast):
    _, hf, directory, _ = hf_pair
    ours = scratchlm.from_pretrained(directory, **fast)
    ids = random_ids(seed=5)
    with torch.no_grad():
        assert (ours(ids) - hf_logits(hf, ids)).abs().max().item() <= LOGIT_TOL


def test_fast_decode_greedy_matches_hf_generate(hf_pair):
    """The packed FastDecoder step (decode="fast") on imported weights reproduces HF's greedy tokens."""
    _, hf, directory, _ = hf_pair
    ours = scratchlm.from_pretrained(directory, attn_impl="sdpa", ops_impl="fused")
    prompt = random_ids(batch=2, length=8, seed=3)
    expected = hf_greedy(hf, prompt, 24)
    got = generate(ours, prompt.tolist(), 24, decode="fast")
    assert got == expected[:, 8:].tolist()


def test_greedy_generation_matches_hf_generate(hf_pair):
    _, hf, _, ours = hf_pair
    prompt = random_ids(batch=2, length=8, seed=2)
    expected = hf_greedy(hf, prompt, 32)
    assert expected.shape == (2, 40)
    assert len(set(expected[:, 8:].flatten().tolist())) >= 10  # a varied continuation, not one repeated token
    new_tokens = generate(ours, prompt.tolist(), max_new_tokens=32)  # scratchlm's KV-cache engine, greedy
    assert new_tokens == expected[:, 8:].tolist()


def test_hf_to_scratchlm_to_hf_is_exact(hf_pair, tmp_path):
    _, hf, directory, _ = hf_pair
    check_save(hf, directory, tmp_path / "back")  # same tensors, same HF class, identical reloaded logits


def _our_model(family: str) -> TransformerLM:
    """A scratchlm model with the architecture of `family` (random biases and gains, seed 7)."""
    config = config_from_hf(build_hf(family).config.to_dict())
    return randomize_(TransformerLM(config), seed=7)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_scratchlm_to_hf_to_scratchlm_is_exact(family, tmp_path):
    ours = _our_model(family)
    directory = scratchlm.save_pretrained(ours, tmp_path / "hf")
    back = scratchlm.from_pretrained(directory)
    assert back.config == ours.config
    state, back_state = ours.state_dict(), back.state_dict()
    assert sorted(back_state) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(back_state[name], tensor), name
    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = random_ids(seed=4)
    with torch.no_grad():
        assert (ours(ids) - hf_logits(hf, ids)).abs().max().item() <= LOGIT_TOL


def test_loaded_model_is_trainable_with_tied_head(hf_pair):
    family, hf, _, ours = hf_pair
    tied = hf.config.tie_word_embeddings
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied
    ids = random_ids(batch=2, length=8)
    ours(ids).logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in ours.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values()), family


@pytest.mark.parametrize("family", ["llama_tied_gqa", "gpt2"])
def test_base_model_checkpoint_without_prefix_loads(family, tmp_path):
    """LlamaModel / GPT2Model checkpoints lack the model./transformer. prefix; with a tied head they load."""
    hf = build_hf(family)
    base = hf.model if hasattr(hf, "model") else hf.transformer
    base.save_pretrained(tmp_path)
    assert not any(k.startswith(("model.", "transformer.")) for k in safetensors_state(tmp_path))
    ours = scratchlm.from_pretrained(tmp_path)
    ids = random_ids()
    with torch.no_grad():
        assert (ours(ids) - hf_logits(hf, ids)).abs().max().item() <= LOGIT_TOL


def test_bfloat16_checkpoint_is_upcast_to_fp32(tmp_path):
    hf = build_hf("qwen2").to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    ours = scratchlm.from_pretrained(tmp_path)
    theirs = hf.state_dict()
    for name, tensor in ours.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, theirs[name].float()), name


@pytest.mark.parametrize("preset,overrides,family", [
    ("gpt2-tiny", dict(mlp_bias=False, qkv_bias=False, norm_bias=False, tie_embeddings=False), "gpt2"),
    ("llama-tiny", dict(attn_out_bias=True), "llama"),
    ("llama-tiny", dict(qkv_bias=True, mlp_bias=True, n_kv_heads=1), "llama"),
    ("llama-tiny", dict(qkv_bias=True, qk_norm=True, tie_embeddings=False), "qwen3"),
])
def test_missing_biases_export_as_zeros(preset, overrides, family, tmp_path):
    """Configs an HF family represents only with extra (zero) biases: same logits in transformers and back."""
    from scratchlm.config import get_preset

    ours = randomize_(TransformerLM(get_preset(preset, vocab_size=96, d_model=64, n_layers=2, **overrides)), seed=3)
    directory = scratchlm.save_pretrained(ours, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    assert hf.config.model_type == family
    back = scratchlm.from_pretrained(directory)
    ids = random_ids()
    with torch.no_grad():
        expected = ours(ids)
        assert (hf_logits(hf, ids) - expected).abs().max().item() <= LOGIT_TOL
        assert (back(ids) - expected).abs().max().item() <= LOGIT_TOL
