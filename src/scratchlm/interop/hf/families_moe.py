"""The mixture-of-experts families (config.json <-> ModelConfig), read as transformers does.

    mixtral     MixtralForCausalLM    num_local_experts (= num_experts), num_experts_per_tok, softmax then
                                      top-k then renormalise, expert width intermediate_size, router_aux_loss_coef,
                                      sliding_window on every layer; checkpoint names block_sparse_moe.gate,
                                      experts.{e}.w1 (gate) / w3 (up) / w2 (down)
    qwen3_moe   Qwen3MoeForCausalLM   + QK-norm, attention_bias, norm_topk_prob (default false),
                                      moe_intermediate_size, dense layers (width intermediate_size) from
                                      mlp_only_layers and decoder_sparse_step; use_sliding_window: every layer
    qwen2_moe   Qwen2MoeForCausalLM   + a sigmoid-gated shared expert (shared_expert_intermediate_size),
                                      q/k/v bias (qkv_bias), windows on layer_types (default: even layers below
                                      max_window_layers with use_sliding_window); no QK-norm
Experts are stored per expert on the Hub (mlp.experts.{e}.{gate,up,down}_proj.weight); scratchlm stacks
them (E, F, D) on load and splits them again on save (state_dict.py). router_jitter_noise (training-time
noise) is not implemented by scratchlm's trainer; it does not change the model.
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.family_helpers import (Fields, default, rope_sizes, rope_sizes_to_hf, uniform_windows, unusual,
                                         windows_all_layers, windows_from_types, windows_to_hf)

MIXTRAL_EXPERTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
QWEN_EXPERTS = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
MOE_CAN = {"rope_scaling", "moe_num_experts"}


def _experts(hf: dict[str, Any], default_count: int) -> int:
    return hf.get("num_experts") or hf.get("num_local_experts") or default_count


def _dense_layers(hf: dict[str, Any], n_layers: int, n_experts: int) -> tuple[int, ...]:
    """Qwen-MoE: a layer is dense when listed in mlp_only_layers or not on the decoder_sparse_step grid."""
    only, step = hf.get("mlp_only_layers") or [], hf.get("decoder_sparse_step", 1)
    return tuple(i for i in range(n_layers) if i in only or not (n_experts > 0 and (i + 1) % step == 0))


def read_mixtral(hf: dict[str, Any]) -> Fields:
    fields = rope_sizes(hf, "mixtral", default_theta=1_000_000.0)
    return {**fields, **windows_all_layers(hf), "moe_num_experts": _experts(hf, 8),
            "moe_top_k": hf.get("num_experts_per_tok", 2), "moe_d_ff": fields["d_ff"], "moe_norm_topk_prob": True,
            "moe_aux_loss_coef": float(hf.get("router_aux_loss_coef", 0.001))}


def _moe_shape(config: ModelConfig, family: str) -> str | None:
    return f"moe_num_experts=0 ({family} is a mixture of experts)" if config.moe_num_experts == 0 else None


def _renormalised(config: ModelConfig) -> bool:
    """topk_softmax is softmax_topk renormalised (the same weights), which is how the HF families write it."""
    return config.moe_norm_topk_prob or config.moe_router == "topk_softmax"


def fits_mixtral(config: ModelConfig) -> str | None:
    if config.moe_shared_d_ff or config.moe_dense_layers:
        return "a shared expert or dense layers (Mixtral has neither)"
    if not _renormalised(config):
        return "moe_norm_topk_prob=False (Mixtral renormalises the top-k weights)"
    return (_moe_shape(config, "Mixtral") or unusual(config, "Mixtral", MOE_CAN | {"sliding_window", "layer_types"})
            or uniform_windows(config))


def write_mixtral(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "intermediate_size": config.moe_d_ff, "sliding_window": config.sliding_window,
            "num_local_experts": config.moe_num_experts, "num_experts_per_tok": config.moe_top_k,
            "router_aux_loss_coef": config.moe_aux_loss_coef, "router_jitter_noise": 0.0}


def _read_qwen_moe(hf: dict[str, Any], family: str, n_default: int, width_default: int) -> Fields:
    fields = rope_sizes(hf, family)
    n_experts = _experts(hf, n_default)
    return {**fields, "moe_num_experts": n_experts, "moe_top_k": default(hf, "num_experts_per_tok", 8),
            "moe_d_ff": default(hf, "moe_intermediate_size", width_default),
            "moe_norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
            "moe_dense_layers": _dense_layers(hf, fields["n_layers"], n_experts),
            "moe_aux_loss_coef": float(hf.get("router_aux_loss_coef", 0.001))}


def read_qwen3_moe(hf: dict[str, Any]) -> Fields:
    bias = bool(hf.get("attention_bias", False))
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    return {**_read_qwen_moe(hf, "qwen3_moe", 128, 768), "sliding_window": window, "qk_norm": True,
            "qkv_bias": bias, "attn_out_bias": bias}


def fits_qwen3_moe(config: ModelConfig) -> str | None:
    if config.moe_shared_d_ff or not config.qk_norm:
        return "a shared expert or no QK-norm (Qwen3-MoE has QK-norm and no shared expert)"
    can = MOE_CAN | {"qk_norm", "qkv_bias", "attn_out_bias", "sliding_window", "layer_types"}
    return _moe_shape(config, "Qwen3-MoE") or unusual(config, "Qwen3-MoE", can) or uniform_windows(config)


def _write_qwen_moe(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "use_sliding_window": config.sliding_window is not None,
            "num_experts": config.moe_num_experts, "num_experts_per_tok": config.moe_top_k,
            "moe_intermediate_size": config.moe_d_ff, "norm_topk_prob": _renormalised(config),
            "mlp_only_layers": list(config.moe_dense_layers), "decoder_sparse_step": 1,
            "router_aux_loss_coef": config.moe_aux_loss_coef}


def write_qwen3_moe(config: ModelConfig) -> Fields:
    return {**_write_qwen_moe(config), "sliding_window": config.sliding_window,
            "attention_bias": config.qkv_bias or config.attn_out_bias}


def read_qwen2_moe(hf: dict[str, Any]) -> Fields:
    fields = _read_qwen_moe(hf, "qwen2_moe", 60, 1408)
    window = (hf.get("sliding_window") or None) if hf.get("use_sliding_window") else None
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 and i < first and window is not None
                                      else "full_attention" for i in range(fields["n_layers"])]
    return {**fields, **windows_from_types(window, types), "qkv_bias": bool(hf.get("qkv_bias", True)),
            "moe_shared_d_ff": default(hf, "shared_expert_intermediate_size", 5632)}


def fits_qwen2_moe(config: ModelConfig) -> str | None:
    if not config.moe_shared_d_ff:
        return "moe_shared_d_ff=0 (Qwen2-MoE has a shared expert)"
    can = MOE_CAN | {"qkv_bias", "sliding_window", "layer_types"}
    return _moe_shape(config, "Qwen2-MoE") or unusual(config, "Qwen2-MoE", can)


def write_qwen2_moe(config: ModelConfig) -> Fields:
    return {**_write_qwen_moe(config), **windows_to_hf(config), "max_window_layers": config.n_layers,
            "shared_expert_intermediate_size": config.moe_shared_d_ff, "qkv_bias": config.qkv_bias}
