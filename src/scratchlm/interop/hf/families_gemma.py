"""The Gemma families (config.json <-> ModelConfig), read as transformers' Gemma*Config classes do,
defaults included.

    gemma        GemmaForCausalLM      RMSNorm (1 + w), embeddings * sqrt(D), GeGLU (hidden_act "gelu" is
                                       read as the tanh GELU, as transformers does), head_dim (default 256),
                                       attention_bias, tied head by default
    gemma2       Gemma2ForCausalLM     + four norms per block (sandwich), attention scale
                                       query_pre_attn_scalar^-1/2 (default 256), attn_logit_softcapping
                                       (default 50) and final_logit_softcapping (default 30), sliding windows
                                       on layer_types (default: every other layer, the first one sliding)
    gemma3_text  Gemma3ForCausalLM     as gemma2 + QK-norm per head (1 + w), local RoPE base for the sliding
                                       layers (rope_local_base_freq / rope_parameters.sliding_attention),
                                       default pattern 5 sliding : 1 full (sliding_window_pattern);
                                       attn_logit_softcapping is not used by Gemma-3 (ignored)
Per-layer norm names (HF -> ours): post_attention_layernorm -> attn_output_norm,
pre_feedforward_layernorm -> post_attention_layernorm, post_feedforward_layernorm -> ffn_output_norm.
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.family_helpers import (Fields, default, refuse_window_fields, rope_sizes,
                                         rope_sizes_to_hf, unusual, windows_from_types, windows_to_hf)
from scratchlm.interop.hf.rope_config import unsupported

SANDWICH_RENAMES = {"post_attention_layernorm": "attn_output_norm",
                    "pre_feedforward_layernorm": "post_attention_layernorm",
                    "post_feedforward_layernorm": "ffn_output_norm"}
GEMMA_CAN = {"norm_unit_offset", "embedding_multiplier", "qkv_bias", "attn_out_bias", "rope_scaling"}


def _refuse_bidirectional(hf: dict[str, Any]) -> None:
    if hf.get("use_bidirectional_attention"):
        raise unsupported("use_bidirectional_attention", True, "scratchlm is a causal decoder (EmbeddingGemma-style "
                          "bidirectional encoders are not supported)")


def _common(hf: dict[str, Any], family: str, act_key: str, theta: float = 10_000.0) -> Fields:
    _refuse_bidirectional(hf)
    if hf.get(act_key) == "gelu" and family == "gemma":  # GemmaConfig's legacy conversion
        hf = {**hf, act_key: "gelu_pytorch_tanh"}
    fields = rope_sizes(hf, family, theta, default_head_dim=256, act_key=act_key, default_act="gelu_pytorch_tanh",
                        tie_default=True)
    bias = bool(hf.get("attention_bias", False))
    return {**fields, "norm_unit_offset": True, "embedding_multiplier": fields["d_model"] ** 0.5, "qkv_bias": bias,
            "attn_out_bias": bias}


def _attn_scale(hf: dict[str, Any]) -> float:
    return default(hf, "query_pre_attn_scalar", 256) ** -0.5


def read_gemma(hf: dict[str, Any]) -> Fields:
    refuse_window_fields(hf, "gemma")
    return _common(hf, "gemma", "hidden_act")


def read_gemma2(hf: dict[str, Any]) -> Fields:
    fields = _common(hf, "gemma2", "hidden_activation")
    n = fields["n_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    return {**fields, **windows_from_types(default(hf, "sliding_window", 4096), types), "norm_placement": "sandwich",
            "attn_scale": _attn_scale(hf), "attn_softcap": default(hf, "attn_logit_softcapping", 50.0),
            "final_softcap": default(hf, "final_logit_softcapping", 30.0)}


def read_gemma3(hf: dict[str, Any]) -> Fields:
    fields = _common(hf, "gemma3_text", "hidden_activation", theta=1_000_000.0)
    n, pattern = fields["n_layers"], hf.get("sliding_window_pattern", 6)
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    return {**fields, **windows_from_types(default(hf, "sliding_window", 4096), types), "norm_placement": "sandwich",
            "attn_scale": _attn_scale(hf), "final_softcap": default(hf, "final_logit_softcapping", None),
            "qk_norm": True}


def _gemma_shape(config: ModelConfig, family: str, can: set[str]) -> str | None:
    """Why `config` is not a Gemma-style model: (1 + w) norms and embeddings scaled by sqrt(D) exactly."""
    if not config.norm_unit_offset:
        return f"norm_unit_offset=False ({family} norms are 1 + w)"
    if config.embedding_multiplier != config.d_model ** 0.5:
        return f"embedding_multiplier={config.embedding_multiplier} ({family} scales by sqrt(d_model))"
    return unusual(config, family, GEMMA_CAN | can)


def _query_pre_attn_scalar(config: ModelConfig) -> str | int:
    """q with q^-1/2 == attn_scale exactly (an int, as transformers types it), or why there is none."""
    scale = config.attn_scale if config.attn_scale is not None else config.head_dim ** -0.5
    q = round(scale ** -2)
    return q if q > 0 and q ** -0.5 == scale else f"attn_scale={config.attn_scale} (not q^-1/2 for an integer q)"


def fits_gemma(config: ModelConfig) -> str | None:
    return _gemma_shape(config, "Gemma", set())


def fits_gemma2(config: ModelConfig) -> str | None:
    if config.norm_placement != "sandwich":
        return f"norm_placement={config.norm_placement!r} (Gemma-2 has four norms per block)"
    can = {"norm_placement", "attn_scale", "attn_softcap", "final_softcap", "sliding_window", "layer_types"}
    reason = _gemma_shape(config, "Gemma-2", can)
    return reason or (q if isinstance(q := _query_pre_attn_scalar(config), str) else None)


def fits_gemma3(config: ModelConfig) -> str | None:
    if config.norm_placement != "sandwich" or not config.qk_norm:
        return f"norm_placement={config.norm_placement!r}, qk_norm={config.qk_norm} (Gemma-3: sandwich + QK-norm)"
    if config.rope_scaling is not None and config.rope_local_base is None:
        return "rope_scaling with rope_local_base=None (Gemma-3's local RoPE is unscaled)"
    can = {"norm_placement", "attn_scale", "final_softcap", "sliding_window", "layer_types", "qk_norm",
           "rope_local_base"}
    reason = _gemma_shape(config, "Gemma-3", can)
    return reason or (q if isinstance(q := _query_pre_attn_scalar(config), str) else None)


def _write(config: ModelConfig, act_key: str) -> Fields:
    out = rope_sizes_to_hf(config, act_key)
    if config.activation == "gelu" and config.ffn == "glu":
        out[act_key] = "gelu_python"  # "gelu" would be read as the tanh approximation by GemmaConfig
    return {**out, "attention_bias": config.qkv_bias or config.attn_out_bias}


def write_gemma(config: ModelConfig) -> Fields:
    return _write(config, "hidden_act")


def write_gemma2(config: ModelConfig) -> Fields:
    return {**_write(config, "hidden_activation"), **windows_to_hf(config),
            "query_pre_attn_scalar": _query_pre_attn_scalar(config), "attn_logit_softcapping": config.attn_softcap,
            "final_logit_softcapping": config.final_softcap}


def write_gemma3(config: ModelConfig) -> Fields:
    out = {**_write(config, "hidden_activation"), **windows_to_hf(config),
           "query_pre_attn_scalar": _query_pre_attn_scalar(config), "final_logit_softcapping": config.final_softcap}
    if config.rope_local_base is None:  # the sliding layers share the global (unscaled) RoPE
        out["rope_parameters"] = {"full_attention": out["rope_parameters"],
                                  "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_base}}
    return out

