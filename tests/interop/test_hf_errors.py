"""Unsupported architectures, config fields and broken checkpoints give clear errors naming the cause."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import build_hf
from safetensors.torch import load_file, save_file

import scratchlm
from scratchlm.config import ModelConfig, get_preset
from scratchlm.model import TransformerLM


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    build_hf("llama_untied_gqa").save_pretrained(directory)
    return directory


def _with_config(src, dst, **changes):
    """Copy the HF dir src to dst with config.json fields changed (None deletes)."""
    dst.mkdir()
    for path in src.iterdir():
        (dst / path.name).write_bytes(path.read_bytes())
    config = json.loads((src / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes,field", [
    (dict(model_type="falcon"), "model_type"),
    (dict(architectures=["LlamaForSequenceClassification"]), "architectures"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}), "high_freq_factor"),
    (dict(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}), "rope_parameters.rope_type"),
    (dict(rope_parameters=None, rope_theta=1e4, rope_scaling={"type": "mrope", "factor": 2.0}), "rope_parameters.rope_type"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor"),
    (dict(layer_types=["chunked_attention", "full_attention"]), "layer_types"),
    (dict(hidden_act="quick_gelu"), "hidden_act"),
    (dict(quantization_config={"quant_method": "gptq"}), "quantization_config"),
    (dict(hidden_size=None), "hidden_size"),
])
def test_unsupported_hf_config_fields(llama_dir, tmp_path, changes, field):
    directory = _with_config(llama_dir, tmp_path / "bad", **changes)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        scratchlm.from_pretrained(directory)


@pytest.mark.parametrize("changes,field", [
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    (dict(scale_attn_weights=False), "scale_attn_weights"),
    (dict(activation_function="quick_gelu"), "activation_function"),
    (dict(add_cross_attention=True), "add_cross_attention"),
])
def test_unsupported_gpt2_fields(tmp_path, changes, field):
    build_hf("gpt2").save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=field):
        scratchlm.from_pretrained(_with_config(tmp_path / "gpt2", tmp_path / "bad", **changes))


def test_checkpoint_not_matching_config(llama_dir, tmp_path):
    with pytest.raises(ValueError, match=r"wrong shapes .*embed_tokens"):
        scratchlm.from_pretrained(_with_config(llama_dir, tmp_path / "vocab", vocab_size=200))
    with pytest.raises(ValueError, match="missing tensor|missing .*layers.2"):
        scratchlm.from_pretrained(_with_config(llama_dir, tmp_path / "layers", num_hidden_layers=3))
    directory = _with_config(llama_dir, tmp_path / "nohead")
    state = load_file(str(directory / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        scratchlm.from_pretrained(directory)


@pytest.mark.parametrize("changes,match", [
    (dict(num_key_value_heads=4), r"qkv_proj.weight' has 128 rows .* 64 \+ 64 \+ 64 = 192"),
    (dict(intermediate_size=80), r"gate_up_proj.weight' has 192 rows .* 80 \+ 80 = 160"),
])
def test_phi3_fused_matrices_not_matching_config(tmp_path, changes, match):
    """Phi-3's fused qkv_proj / gate_up_proj are split by the config's sizes: a mismatch names both."""
    from interop_helpers import randomize_
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, pad_token_id=None)
    randomize_(Phi3ForCausalLM(config)).save_pretrained(tmp_path / "phi3")
    with pytest.raises(ValueError, match=match):
        scratchlm.from_pretrained(_with_config(tmp_path / "phi3", tmp_path / "bad", **changes))


def test_missing_files_are_clear(llama_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        scratchlm.from_pretrained(tmp_path)
    directory = _with_config(llama_dir, tmp_path / "pickle")
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin.*safetensors"):
        scratchlm.from_pretrained(directory)


@pytest.mark.parametrize("overrides,field", [
    (dict(norm_placement="post"), "norm_placement"),
    (dict(pos_embedding="sinusoidal"), "pos_embedding"),
    (dict(norm="layernorm"), "norm"),
    (dict(ffn="mlp"), "ffn"),
    (dict(qk_norm=True, mlp_bias=True), "mlp_bias"),
])
def test_export_refuses_configs_hf_cannot_represent(tmp_path, overrides, field):
    model = TransformerLM(get_preset("llama-tiny", n_layers=1, **overrides))
    with pytest.raises(ValueError, match=field):
        scratchlm.save_pretrained(model, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_export_refuses_gpt2_incompatible(tmp_path):
    model = TransformerLM(get_preset("gpt2-tiny", n_layers=1, n_kv_heads=2))
    with pytest.raises(ValueError, match="n_kv_heads"):
        scratchlm.save_pretrained(model, tmp_path)
    with pytest.raises(ValueError, match="TransformerLM"):
        scratchlm.save_pretrained(torch.nn.Linear(2, 2), tmp_path)


def test_scratchlm_dir_loads_through_from_pretrained(tmp_path):
    from scratchlm.model_files import save_model

    model = TransformerLM(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, max_seq_len=16))
    loaded = scratchlm.from_pretrained(save_model(model, tmp_path))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_qwen3_without_head_dim_uses_hf_default(tmp_path):
    """Qwen3Config defaults head_dim to 128 (not D / H); a config.json without it must load as HF does."""
    from interop_helpers import FAMILIES, hf_logits, random_ids, randomize_
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kwargs = {k: v for k, v in FAMILIES["qwen3"][2].items() if k != "head_dim"}
    hf = randomize_(Qwen3ForCausalLM(Qwen3Config(**kwargs)), seed=5).eval()
    assert hf.config.head_dim == 128 != kwargs["hidden_size"] // kwargs["num_attention_heads"]
    hf.save_pretrained(tmp_path / "src")
    ours = scratchlm.from_pretrained(_with_config(tmp_path / "src", tmp_path / "nohd", head_dim=None))
    assert ours.config.head_dim == 128
    ids = random_ids()
    with torch.no_grad():
        assert (ours(ids) - hf_logits(hf, ids)).abs().max().item() <= 1e-4
