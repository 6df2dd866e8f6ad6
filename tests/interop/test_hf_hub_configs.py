"""config.json as the real checkpoints on the Hub store it (older keys and all: `rope_scaling` with "type",
`rope_local_base_freq`, `hidden_activation`, `cache_implementation`, `pretraining_tp`, Phi-3's top-level
`original_max_position_embeddings`, ...), shrunk to 2-4 layers of width 64: transformers and scratchlm read
the same model from the same directory (fp32 logits within 1e-4 past every window and original context,
20 greedy tokens identical through the FastDecoder)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from interop_helpers import randomize_
from transformers import AutoConfig, AutoModelForCausalLM

import scratchlm
from scratchlm.generate.engine import generate

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, bos_token_id=1, eos_token_id=2, initializer_range=0.02, rms_norm_eps=1e-5,
             torch_dtype="bfloat16", use_cache=True, attention_dropout=0.0, hidden_act="silu")
L0 = 16  # every original context here: the 40-token check and the generations pass it


def _factors(n: int, start: float) -> list[float]:
    return [start + 0.3 * i for i in range(n)]


def _llama3(factor: float) -> dict:
    return {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": L0, "rope_type": "llama3"}


HUB = {  # name -> the checkpoint's config.json keys (its sizes replaced by SMALL's)
    "Llama-3.1-8B": dict(model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False,
                         mlp_bias=False, max_position_embeddings=131072, pretraining_tp=1, rope_theta=500000.0,
                         tie_word_embeddings=False, rope_scaling=_llama3(8.0)),
    "Llama-3.2-1B": dict(model_type="llama", architectures=["LlamaForCausalLM"], head_dim=16,
                         max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                         eos_token_id=[2, 3], rope_scaling=_llama3(32.0)),
    "Mistral-7B-v0.1": dict(model_type="mistral", architectures=["MistralForCausalLM"], max_position_embeddings=32768,
                            rope_theta=10000.0, sliding_window=6, tie_word_embeddings=False),
    "Mistral-Nemo": dict(model_type="mistral", architectures=["MistralForCausalLM"], head_dim=24,
                         max_position_embeddings=1024000, rope_theta=1e6, sliding_window=None),
    "gemma-2b": dict(model_type="gemma", architectures=["GemmaForCausalLM"], head_dim=32, hidden_act="gelu",
                     pad_token_id=0, rope_scaling=None, rope_theta=10000.0, max_position_embeddings=8192),
    "gemma-2-2b": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], attn_logit_softcapping=50.0,
                       cache_implementation="hybrid", final_logit_softcapping=30.0, head_dim=32,
                       hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                       max_position_embeddings=8192, pad_token_id=0, query_pre_attn_scalar=32, sliding_window=6),
    "gemma-3-1b": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], attn_logit_softcapping=None,
                       cache_implementation="hybrid", final_logit_softcapping=None, head_dim=32,
                       hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, num_hidden_layers=3,
                       query_pre_attn_scalar=32, rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000,
                       sliding_window=5, sliding_window_pattern=2),
    "gemma-3-4b-text": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], head_dim=32,
                            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                            num_hidden_layers=3, query_pre_attn_scalar=32, rope_local_base_freq=10000.0,
                            rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1000000.0,
                            sliding_window=5, sliding_window_pattern=2),
    "Phi-3-mini-4k": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], embd_pdrop=0.0, resid_pdrop=0.0,
                          max_position_embeddings=4096, original_max_position_embeddings=4096, rope_scaling=None,
                          sliding_window=7, tie_word_embeddings=False, pad_token_id=0,
                          auto_map={"AutoConfig": "configuration_phi3.Phi3Config"}),
    "Phi-3.5-mini": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], max_position_embeddings=131072,
                         original_max_position_embeddings=L0, sliding_window=262144, pad_token_id=0,
                         rope_scaling={"long_factor": _factors(8, 1.5), "short_factor": _factors(8, 1.0),
                                       "type": "longrope"}),
    "Phi-4-mini": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.75,
                       max_position_embeddings=131072, original_max_position_embeddings=L0, sliding_window=262144,
                       tie_word_embeddings=True, pad_token_id=0, full_attn_mod=1, interpolate_factor=1,
                       lm_head_bias=False,
                       rope_scaling={"long_factor": _factors(6, 1.5), "short_factor": _factors(6, 1.0),
                                     "type": "longrope"}),
    "Mixtral-8x7B": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], intermediate_size=48,
                         max_position_embeddings=32768, num_experts_per_tok=2, num_local_experts=4,
                         output_router_logits=False, rope_theta=1e6, router_aux_loss_coef=0.02, sliding_window=None),
    "Qwen3-30B-A3B": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], decoder_sparse_step=1,
                          head_dim=16, max_position_embeddings=40960, max_window_layers=2, mlp_only_layers=[],
                          moe_intermediate_size=32, norm_topk_prob=True, num_experts=6, num_experts_per_tok=2,
                          output_router_logits=False, rope_scaling=None, rope_theta=1e6, sliding_window=None,
                          use_sliding_window=False),
    "Qwen1.5-MoE-A2.7B": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], decoder_sparse_step=1,
                              max_position_embeddings=8192, max_window_layers=2, moe_intermediate_size=32,
                              norm_topk_prob=False, num_experts=5, num_experts_per_tok=2,
                              shared_expert_intermediate_size=40, sliding_window=32768, use_sliding_window=False,
                              mlp_only_layers=[]),
    "OLMo-2-1124-7B": dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], attention_bias=False, pad_token_id=3,
                           max_position_embeddings=4096, rope_scaling=None, rope_theta=500000,
                           tie_word_embeddings=False, rms_norm_eps=1e-6),
    "granite-3.1-2b": dict(model_type="granite", architectures=["GraniteForCausalLM"], attention_dropout=0.1,
                           max_position_embeddings=131072, attention_multiplier=0.015625,
                           embedding_multiplier=12.0, logits_scaling=8.0, mlp_bias=False, residual_multiplier=0.22,
                           rope_theta=5e6, tie_word_embeddings=True),
    "SmolLM3-3B": dict(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], bos_token_id=None,
                       layer_types=["full_attention"] * 4, max_position_embeddings=65536, max_window_layers=4,
                       no_rope_layer_interval=4, no_rope_layers=[1, 1, 1, 0], num_hidden_layers=4, pad_token_id=3,
                       pretraining_tp=2, rope_theta=5e6, sliding_window=None, use_sliding_window=False),
    "Qwen2.5-7B": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], max_position_embeddings=32768,
                       max_window_layers=2, rope_theta=1e6,
                       sliding_window=131072, tie_word_embeddings=True, use_sliding_window=False),
}


@pytest.mark.parametrize("name", sorted(HUB))
def test_hub_config_reads_as_transformers_reads_it(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, **HUB[name]}))
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    randomize_(hf.float()).save_pretrained(tmp_path / "weights")
    shutil.copy(tmp_path / "weights" / "model.safetensors", tmp_path)  # next to the Hub-style config.json
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = scratchlm.from_pretrained(tmp_path)
    ids = torch.randint(3, 96, (2, 40), generator=torch.Generator().manual_seed(0))
    hf.generation_config.eos_token_id = None  # 20 tokens without HF's min-length eos suppression
    with torch.no_grad():
        for length in (12, 40):  # within and past L0 (longrope: short and long factors)
            assert (ours(ids[:, :length]) - hf(ids[:, :length]).logits).abs().max().item() <= 1e-4, length
        out = hf.generate(ids[:, :10], attention_mask=torch.ones_like(ids[:, :10]), max_new_tokens=20,
                          do_sample=False, pad_token_id=0)
    assert generate(ours, ids[:, :10].tolist(), 20, decode="fast") == out[:, 10:].tolist()
