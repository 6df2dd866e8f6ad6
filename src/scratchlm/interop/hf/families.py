"""The HF families as data: per model_type, its classes, how its config.json maps onto ModelConfig fields
(`read`), what it can represent (`fits`, a reason when not), how a ModelConfig is written back (`write`),
and the per-layer module names that differ from ours (`renames`, HF name -> ours; see state_dict.py).

    model_type   HF class               reads (besides the Llama-style sizes, norms, RoPE of rope_config.py)
    llama        LlamaForCausalLM       attention_bias -> q/k/v/o bias, mlp_bias, hidden_act (gated FFN)
    mistral      MistralForCausalLM     sliding_window on every layer (null: none); no biases
    qwen2        Qwen2ForCausalLM       q/k/v bias (no o bias); use_sliding_window + layer_types/max_window_layers
    qwen3        Qwen3ForCausalLM       attention_bias, qk_norm per head (before RoPE), windows as qwen2
    gpt2         GPT2LMHeadModel        layernorm, mlp, learned positions, every bias, activation_function
    gemma*       see families_gemma.py
    phi3, olmo2, granite, smollm3: see families_phi_olmo_granite.py
    mixtral, qwen3_moe, qwen2_moe (mixtures of experts): see families_moe.py

Everything else that changes the math and is not read here is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from scratchlm.config import ModelConfig
from scratchlm.interop.hf import families_gemma as gemma
from scratchlm.interop.hf import families_moe as moe
from scratchlm.interop.hf import families_phi_olmo_granite as more
from scratchlm.interop.hf.family_helpers import (HF_ACTIVATION_NAMES, Fields, activation,
                                         refuse_window_fields, require, rope_sizes, rope_sizes_to_hf, uniform_windows,
                                         unusual, windows_all_layers, windows_qwen, windows_to_hf)
from scratchlm.interop.hf.rope_config import unsupported

__all__ = ["EXPORT_ORDER", "FAMILIES", "Family"]
ROPE_CAN = {"rope_scaling"}


def _read_llama(hf: dict[str, Any]) -> Fields:
    refuse_window_fields(hf, "llama")
    bias = bool(hf.get("attention_bias", False))
    return {**rope_sizes(hf, "llama"), "qkv_bias": bias, "attn_out_bias": bias, "mlp_bias": bool(hf.get("mlp_bias"))}


def _fits_llama(config: ModelConfig) -> str | None:
    return unusual(config, "Llama", ROPE_CAN | {"qkv_bias", "attn_out_bias", "mlp_bias"})


def _write_llama(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "attention_bias": config.qkv_bias or config.attn_out_bias,
            "mlp_bias": config.mlp_bias}


def _read_mistral(hf: dict[str, Any]) -> Fields:  # layer_types: ignored by MistralModel (it warns)
    return {**rope_sizes(hf, "mistral"), **windows_all_layers(hf)}


def _fits_mistral(config: ModelConfig) -> str | None:
    return unusual(config, "Mistral", ROPE_CAN | {"sliding_window", "layer_types"}) or uniform_windows(config)


def _write_mistral(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "sliding_window": config.sliding_window}


def _read_qwen2(hf: dict[str, Any]) -> Fields:
    fields = rope_sizes(hf, "qwen2")
    return {**fields, **windows_qwen(hf, fields["n_layers"]), "qkv_bias": True}


def _fits_qwen2(config: ModelConfig) -> str | None:
    """Qwen2 (q/k/v biases, zero-filled when absent) is picked for q/k/v-only biases or per-layer windows."""
    reason = unusual(config, "Qwen2", ROPE_CAN | {"qkv_bias", "sliding_window", "layer_types"})
    if reason is None and config.head_dim * config.n_heads != config.d_model:
        reason = f"head_dim={config.head_dim} (Qwen2 has head_dim = hidden_size / heads)"
    if reason is None and not config.qkv_bias and uniform_windows(config) is None:
        reason = "qkv_bias=False and one window kind for all layers (Llama/Mistral fit)"
    return reason


def _write_qwen(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), **windows_to_hf(config), "use_sliding_window": config.sliding_window is not None,
            "max_window_layers": config.n_layers, "attention_bias": config.qkv_bias or config.attn_out_bias}


def _read_qwen3(hf: dict[str, Any]) -> Fields:
    bias = bool(hf.get("attention_bias", False))
    fields = rope_sizes(hf, "qwen3", default_head_dim=128)
    return {**fields, **windows_qwen(hf, fields["n_layers"]), "qkv_bias": bias, "attn_out_bias": bias, "qk_norm": True}


def _fits_qwen3(config: ModelConfig) -> str | None:
    if not config.qk_norm:
        return "qk_norm=False (Qwen3 has QK-norm)"
    return unusual(config, "Qwen3", ROPE_CAN | {"qkv_bias", "attn_out_bias", "qk_norm", "sliding_window", "layer_types"})


def _read_gpt2(hf: dict[str, Any]) -> Fields:
    for name, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if hf.get(name, ok) != ok:
            raise unsupported(name, hf[name], f"scratchlm's attention needs {name}={ok}")
    d_model = require(hf, "n_embd")
    return dict(
        vocab_size=require(hf, "vocab_size"), d_model=d_model, n_layers=require(hf, "n_layer"),
        n_heads=require(hf, "n_head"), d_ff=hf.get("n_inner") or 4 * d_model, max_seq_len=require(hf, "n_positions"),
        norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), norm_bias=True, ffn="mlp",
        activation=activation(hf, "activation_function", "gelu_new"), mlp_bias=True, qkv_bias=True,
        attn_out_bias=True, pos_embedding="learned", tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        init_std=float(hf.get("initializer_range") or 0.02), hf_family="gpt2",
    )


def _fits_gpt2(config: ModelConfig) -> str | None:
    for name, want in (("pos_embedding", "learned"), ("norm", "layernorm"), ("ffn", "mlp"),
                       ("n_kv_heads", config.n_heads), ("head_dim", config.d_model // config.n_heads)):
        if getattr(config, name) != want:
            return f"{name}={getattr(config, name)!r} (GPT-2 needs {want!r})"
    return unusual(config, "GPT-2", {"pos_embedding", "norm", "qkv_bias", "attn_out_bias", "mlp_bias"})


def _write_gpt2(config: ModelConfig) -> Fields:
    return dict(n_embd=config.d_model, n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
                n_positions=config.max_seq_len, layer_norm_epsilon=config.norm_eps,
                activation_function=HF_ACTIVATION_NAMES[config.activation], resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0)


def _any_bias(config: ModelConfig) -> bool:
    return config.qkv_bias or config.attn_out_bias


@dataclass(frozen=True)
class Family:
    """One HF model_type: its classes and its config mapping (see the module docstring)."""

    causal_lm: str
    base_model: str
    read: Callable[[dict[str, Any]], Fields]
    fits: Callable[[ModelConfig], str | None]
    write: Callable[[ModelConfig], Fields]
    attention_bias: Callable[[ModelConfig], bool] = _any_bias  # whether the HF model has q/k/v(/o) biases
    o_bias: bool = True  # whether those biases include o_proj's (Qwen2 and Qwen2-MoE: q/k/v only)
    renames: dict[str, str] = field(default_factory=dict)  # per-layer module names, HF -> ours
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)  # HF fused module -> ours, stacked by rows
    experts: dict[str, str] = field(default_factory=dict)  # our stacked expert matrix -> HF per-expert name


FAMILIES: dict[str, Family] = {
    "gpt2": Family("GPT2LMHeadModel", "GPT2Model", _read_gpt2, _fits_gpt2, _write_gpt2, lambda c: True),
    "qwen3": Family("Qwen3ForCausalLM", "Qwen3Model", _read_qwen3, _fits_qwen3, _write_qwen),
    "qwen2": Family("Qwen2ForCausalLM", "Qwen2Model", _read_qwen2, _fits_qwen2, _write_qwen, lambda c: True,
                    o_bias=False),
    "llama": Family("LlamaForCausalLM", "LlamaModel", _read_llama, _fits_llama, _write_llama),
    "mistral": Family("MistralForCausalLM", "MistralModel", _read_mistral, _fits_mistral, _write_mistral,
                      lambda c: False),
    "gemma": Family("GemmaForCausalLM", "GemmaModel", gemma.read_gemma, gemma.fits_gemma, gemma.write_gemma),
    "gemma2": Family("Gemma2ForCausalLM", "Gemma2Model", gemma.read_gemma2, gemma.fits_gemma2, gemma.write_gemma2,
                     renames=gemma.SANDWICH_RENAMES),
    "gemma3_text": Family("Gemma3ForCausalLM", "Gemma3TextModel", gemma.read_gemma3, gemma.fits_gemma3,
                          gemma.write_gemma3, renames=gemma.SANDWICH_RENAMES),
    "phi3": Family("Phi3ForCausalLM", "Phi3Model", more.read_phi3, more.fits_phi3, more.write_phi3,
                   lambda c: False, fused=more.PHI3_FUSED),
    "olmo2": Family("Olmo2ForCausalLM", "Olmo2Model", more.read_olmo2, more.fits_olmo2, more.write_olmo2,
                    renames=more.OUTPUT_NORM_RENAMES),
    "granite": Family("GraniteForCausalLM", "GraniteModel", more.read_granite, more.fits_granite,
                      more.write_granite),
    "smollm3": Family("SmolLM3ForCausalLM", "SmolLM3Model", more.read_smollm3, more.fits_smollm3,
                      more.write_smollm3),
    "mixtral": Family("MixtralForCausalLM", "MixtralModel", moe.read_mixtral, moe.fits_mixtral, moe.write_mixtral,
                      lambda c: False, renames={"block_sparse_moe": "mlp"}, experts=moe.MIXTRAL_EXPERTS),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", "Qwen3MoeModel", moe.read_qwen3_moe, moe.fits_qwen3_moe,
                        moe.write_qwen3_moe, experts=moe.QWEN_EXPERTS),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", "Qwen2MoeModel", moe.read_qwen2_moe, moe.fits_qwen2_moe,
                        moe.write_qwen2_moe, lambda c: c.qkv_bias, o_bias=False, experts=moe.QWEN_EXPERTS),
}
# export tries the families in this order (the most specific first) when the config names none
EXPORT_ORDER = ("gpt2", "qwen2_moe", "qwen3_moe", "mixtral", "gemma3_text", "gemma2", "gemma", "olmo2", "smollm3", "qwen3", "qwen2", "llama", "mistral",
                "granite")
