"""Small HF models with random weights (no download) and helpers shared by the interop tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

V, CTX = 96, 80
_RMS = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=CTX, bos_token_id=None, eos_token_id=None, pad_token_id=None)
# name -> (HF class, HF config class, config kwargs)
FAMILIES = {
    "llama_tied_gqa": (LlamaForCausalLM, LlamaConfig, dict(_RMS, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama_untied_gqa": (LlamaForCausalLM, LlamaConfig,
                         dict(_RMS, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500.0)),
    "llama_bias_headdim": (LlamaForCausalLM, LlamaConfig,
                           dict(_RMS, num_key_value_heads=1, head_dim=24, attention_bias=True, mlp_bias=True,
                                rms_norm_eps=1e-5)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict(_RMS, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(_RMS, num_key_value_heads=2, head_dim=16)),
    "gpt2": (GPT2LMHeadModel, GPT2Config,
             dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=CTX, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)),
}


@torch.no_grad()
def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Matrices ~ N(0, 0.25^2), norm gains ~ U(0.5, 1.5), biases ~ N(0, 0.05^2): nothing trivial, and
    large enough that greedy decoding of these random models is varied rather than one repeated token."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if p.dim() > 1:
            p.copy_(torch.randn(p.shape, generator=g) * 0.25)
        elif ("norm" in name or "ln_" in name) and name.endswith("weight"):
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return module


def build_hf(family: str, seed: int = 0) -> torch.nn.Module:
    cls, config_cls, kwargs = FAMILIES[family]
    return randomize_(cls(config_cls(**kwargs)), seed).eval()


def save_hf(model: torch.nn.Module, directory: Path, **kwargs) -> Path:
    model.save_pretrained(directory, **kwargs)
    return directory


def random_ids(batch: int = 3, length: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits.float()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, ids: torch.Tensor, n: int) -> torch.Tensor:
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)


def safetensors_state(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in directory."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(path)))
    return state
