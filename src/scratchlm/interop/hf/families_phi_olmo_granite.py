"""Phi-3/Phi-4, OLMo-2, Granite and SmolLM3 (config.json <-> ModelConfig), read as transformers does.

    phi3     Phi3ForCausalLM      fused qkv_proj / gate_up_proj (split on load, fused on save, state_dict.py),
                                  partial_rotary_factor (Phi-4-mini: rotary_dim = int(head_dim * factor)),
                                  longrope (the top-level original_max_position_embeddings wins; legacy
                                  "su"/"yarn" types read as longrope), sliding_window on every layer, no biases
    olmo2    Olmo2ForCausalLM     norms on the attention/FFN outputs only (norm_placement "output"),
                                  QK-norm over the whole q / k projection, attention_bias
    granite  GraniteForCausalLM   embedding_multiplier, residual_multiplier, attention_multiplier (the
                                  attention scale), logits_scaling, attention_bias, mlp_bias
    smollm3  SmolLM3ForCausalLM   no_rope_layers (1 = RoPE, 0 = NoPE; default: every 4th layer NoPE),
                                  use_sliding_window + layer_types, attention_bias, mlp_bias, tied head
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.family_helpers import (Fields, default, refuse_window_fields, rope_sizes, rope_sizes_to_hf, unusual,
                                         windows_all_layers, windows_from_types, windows_to_hf)

PHI3_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
              "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
OUTPUT_NORM_RENAMES = {"post_attention_layernorm": "attn_output_norm",
                       "post_feedforward_layernorm": "ffn_output_norm"}
ROPE_CAN = {"rope_scaling"}


def read_phi3(hf: dict[str, Any]) -> Fields:
    return {**rope_sizes(hf, "phi3"), **windows_all_layers(hf)}


def fits_phi3(config: ModelConfig) -> str | None:
    if config.rope_scaling is not None and config.rope_scaling["rope_type"] != "longrope":
        return f"rope_scaling type {config.rope_scaling['rope_type']!r} (Phi-3 reads default or longrope only)"
    kinds = {config.layer_type(i) for i in range(config.n_layers)}
    reason = unusual(config, "Phi-3", ROPE_CAN | {"sliding_window", "layer_types", "rotary_dim"})
    return reason or (f"layer_types={config.layer_types} (one window for every layer)" if len(kinds) > 1 else None)


def write_phi3(config: ModelConfig) -> Fields:
    out = {**rope_sizes_to_hf(config), "sliding_window": config.sliding_window, "resid_pdrop": 0.0,
           "embd_pdrop": 0.0}
    scaling = config.rope_scaling or {}
    if "original_max_position_embeddings" in scaling and scaling["rope_type"] != "dynamic":
        out["original_max_position_embeddings"] = scaling["original_max_position_embeddings"]
    else:  # Phi3Config's own default (4096) would otherwise be copied into a longrope dict on reload
        out["original_max_position_embeddings"] = out["max_position_embeddings"]
    return out


def read_olmo2(hf: dict[str, Any]) -> Fields:
    refuse_window_fields(hf, "olmo2")
    bias = bool(hf.get("attention_bias", False))
    return {**rope_sizes(hf, "olmo2"), "norm_eps": float(hf.get("rms_norm_eps", 1e-5)), "norm_placement": "output",
            "qk_norm": True, "qk_norm_scope": "projection", "qkv_bias": bias, "attn_out_bias": bias}


def fits_olmo2(config: ModelConfig) -> str | None:
    if config.norm_placement != "output" or not config.qk_norm or config.qk_norm_scope != "projection":
        return (f"norm_placement={config.norm_placement!r}, qk_norm={config.qk_norm}, qk_norm_scope="
                f"{config.qk_norm_scope!r} (OLMo-2: 'output', QK-norm over the projection)")
    return unusual(config, "OLMo-2", ROPE_CAN | {"norm_placement", "qk_norm", "qk_norm_scope", "qkv_bias",
                                                 "attn_out_bias"})


def write_olmo2(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "attention_bias": config.qkv_bias or config.attn_out_bias}


def read_granite(hf: dict[str, Any]) -> Fields:
    refuse_window_fields(hf, "granite")
    bias = bool(hf.get("attention_bias", False))
    return {**rope_sizes(hf, "granite"), "qkv_bias": bias, "attn_out_bias": bias, "mlp_bias": bool(hf.get("mlp_bias")),
            "embedding_multiplier": float(default(hf, "embedding_multiplier", 1.0)),
            "residual_multiplier": float(default(hf, "residual_multiplier", 1.0)),
            "attn_scale": float(default(hf, "attention_multiplier", 1.0)),
            "logits_scaling": float(default(hf, "logits_scaling", 1.0))}


def fits_granite(config: ModelConfig) -> str | None:
    return unusual(config, "Granite", ROPE_CAN | {"qkv_bias", "attn_out_bias", "mlp_bias", "embedding_multiplier",
                                                  "residual_multiplier", "attn_scale", "logits_scaling"})


def write_granite(config: ModelConfig) -> Fields:
    scale = config.attn_scale if config.attn_scale is not None else config.head_dim ** -0.5
    return {**rope_sizes_to_hf(config), "attention_bias": config.qkv_bias or config.attn_out_bias,
            "mlp_bias": config.mlp_bias, "embedding_multiplier": config.embedding_multiplier,
            "residual_multiplier": config.residual_multiplier, "attention_multiplier": scale,
            "logits_scaling": config.logits_scaling}


def read_smollm3(hf: dict[str, Any]) -> Fields:
    fields = rope_sizes(hf, "smollm3", default_theta=2_000_000.0, tie_default=True)
    n, interval = fields["n_layers"], hf.get("no_rope_layer_interval", 4)
    use_rope = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    types = hf.get("layer_types") or ["sliding_attention" if window is not None and not use_rope[i]
                                      else "full_attention" for i in range(n)]
    bias = bool(hf.get("attention_bias", False))
    return {**fields, **windows_from_types(window, types), "qkv_bias": bias, "attn_out_bias": bias,
            "mlp_bias": bool(hf.get("mlp_bias")), "nope_layers": tuple(i for i in range(n) if not use_rope[i])}


def fits_smollm3(config: ModelConfig) -> str | None:
    if not config.nope_layers:
        return "nope_layers=() (SmolLM3 is picked for NoPE layers)"
    return unusual(config, "SmolLM3", ROPE_CAN | {"qkv_bias", "attn_out_bias", "mlp_bias", "sliding_window",
                                                  "layer_types", "nope_layers"})


def write_smollm3(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), **windows_to_hf(config), "use_sliding_window": config.sliding_window is not None,
            "no_rope_layers": [0 if i in config.nope_layers else 1 for i in range(config.n_layers)],
            "attention_bias": config.qkv_bias or config.attn_out_bias, "mlp_bias": config.mlp_bias}
