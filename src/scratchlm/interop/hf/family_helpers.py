"""Helpers shared by the HF family mappings (families*.py): required fields, activations, the
Llama-style sizes every RoPE family shares, sliding-window layouts, and `unusual`, which says which
ModelConfig feature a family cannot express.
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.rope_config import rope_from_hf, rope_to_hf, unsupported

Fields = dict[str, Any]
# HF activation names (ACT2FN) -> ours; aliases of one function map to the same name. The reverse map
# picks the first HF name for each of ours.
HF_ACTIVATIONS: dict[str, str] = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                                  "gelu": "gelu", "gelu_python": "gelu", "relu": "relu", "silu": "silu",
                                  "swish": "silu", "sigmoid": "sigmoid"}
HF_ACTIVATION_NAMES = {ours: hf for hf, ours in reversed(list(HF_ACTIVATIONS.items()))}  # GPT-2's names
# the names the RoPE families' configs use (gelu_pytorch_tanh: Gemma's default, torch's tanh-GELU kernel)
ROPE_ACTIVATION_NAMES = {**HF_ACTIVATION_NAMES, "gelu_tanh": "gelu_pytorch_tanh"}
# ModelConfig fields that switch an architecture feature on, with their "off" value. A family lists the
# ones it can express; `unusual` reports any other that is not off.
FEATURE_DEFAULTS: dict[str, Any] = {
    "pos_embedding": "rope", "norm": "rmsnorm", "norm_placement": "pre", "norm_unit_offset": False,
    "qkv_bias": False, "attn_out_bias": False, "mlp_bias": False, "qk_norm": False, "qk_norm_scope": "head",
    "attn_scale": None, "attn_softcap": None, "final_softcap": None, "embedding_multiplier": 1.0,
    "residual_multiplier": 1.0, "logits_scaling": 1.0, "rope_scaling": None, "rope_local_base": None,
    "sliding_window": None, "layer_types": None, "nope_layers": (), "moe_num_experts": 0,
}
PARTIAL_ROTARY_CAN = "rotary_dim"  # a family whose RoPE can rotate part of each head lists this in `can`


def require(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ValueError(f"HF config is missing the required field {key!r} (model_type={hf.get('model_type')!r})")
    return hf[key]


def default(hf: dict[str, Any], key: str, value: Any) -> Any:
    """hf[key] when config.json has the key (even null), else the HF config class's default `value`."""
    return hf[key] if key in hf else value


def activation(hf: dict[str, Any], key: str, fallback: str) -> str:
    """Our name for the HF activation under `key` (aliases such as swish = silu accepted)."""
    act = hf.get(key) or fallback
    if act not in HF_ACTIVATIONS:
        raise unsupported(key, act, f"supported activations: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[act]


def gated_ffn(act: str) -> Fields:
    """A gated FFN with gate activation `act`: SwiGLU for silu, else GLU (GeGLU for gelu_tanh)."""
    return dict(ffn="swiglu") if act == "silu" else dict(ffn="glu", activation=act)


def rope_sizes(hf: dict[str, Any], family: str, default_theta: float = 10_000.0, default_head_dim: int | None = None,
               act_key: str = "hidden_act", default_act: str = "silu", tie_default: bool = False) -> Fields:
    """The fields every Llama-style RoPE family shares: sizes, RMSNorm, gated FFN, RoPE, head."""
    d_model, n_heads = require(hf, "hidden_size"), require(hf, "num_attention_heads")
    fields = dict(
        vocab_size=require(hf, "vocab_size"), d_model=d_model, n_layers=require(hf, "num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or default_head_dim or d_model // n_heads, d_ff=require(hf, "intermediate_size"),
        max_seq_len=require(hf, "max_position_embeddings"), norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        pos_embedding="rope", rope_style="half", tie_embeddings=bool(default(hf, "tie_word_embeddings", tie_default)),
        init_std=float(hf.get("initializer_range") or 0.02), hf_family=family,
        **gated_ffn(activation(hf, act_key, default_act)),
    )
    return {**fields, **rope_from_hf(hf, family, default_theta, fields["head_dim"])}


def rope_sizes_to_hf(config: ModelConfig, act_key: str = "hidden_act") -> Fields:
    act = "silu" if config.ffn == "swiglu" else ROPE_ACTIVATION_NAMES[config.activation]
    out = dict(hidden_size=config.d_model, num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
               num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim, intermediate_size=config.d_ff,
               max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps, attention_dropout=0.0)
    out[act_key] = act
    return {**out, **rope_to_hf(config)}  # rope_to_hf may set max_position_embeddings (dynamic NTK)


def unusual(config: ModelConfig, family: str, can: set[str]) -> str | None:
    """Why `family` cannot represent `config`: the first feature field outside `can` that is not off, or a
    non-gated FFN for a RoPE family; None when nothing stands in the way."""
    for name, off in FEATURE_DEFAULTS.items():
        if name not in can and getattr(config, name) != off:
            return f"{name}={getattr(config, name)!r} ({family} needs {off!r})"
    if config.pos_embedding == "rope" and config.rotary_dim is not None:
        if PARTIAL_ROTARY_CAN not in can:
            return f"rotary_dim={config.rotary_dim} < head_dim={config.head_dim} ({family} rotates whole heads)"
        if int(config.head_dim * (config.rotary_dim / config.head_dim)) != config.rotary_dim:
            return f"rotary_dim={config.rotary_dim} (not int(head_dim * factor) for its factor)"
    if config.pos_embedding == "rope" and config.ffn == "mlp":
        return f"ffn='mlp' ({family} has a gated FFN)"
    return None


def refuse_window_fields(hf: dict[str, Any], family: str) -> None:
    """Families whose forward never reads sliding_window still get a sliding KV cache from transformers'
    generate() when config.json sets one (forward and generate then disagree): refuse instead of guessing."""
    if hf.get("sliding_window") is not None:
        raise unsupported("sliding_window", hf["sliding_window"],
                          f"{family!r} attention ignores it in forward but transformers' generate() cache applies "
                          "it, so the checkpoint has no single meaning; remove it from config.json")


def windows_all_layers(hf: dict[str, Any]) -> Fields:
    """Mistral / Mixtral / Phi-3: `sliding_window` (when not null) applies to every layer."""
    return dict(sliding_window=hf.get("sliding_window"), layer_types=None)


def windows_qwen(hf: dict[str, Any], n_layers: int) -> Fields:
    """Qwen2 / Qwen3: the window exists only with use_sliding_window; layer_types (else: sliding from
    layer max_window_layers on) says which layers use it."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    types = hf.get("layer_types")
    if types is None:
        first = hf.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n_layers)]
    return windows_from_types(window, types)


def windows_from_types(window: int | None, types: list[str]) -> Fields:
    """sliding_window + layer_types, normalised (None when every layer is the same kind)."""
    if window is None and "sliding_attention" in types:
        raise unsupported("layer_types", types, "sliding_attention layers need a sliding_window (and, for Qwen, "
                          "use_sliding_window=true); transformers fails on this config too")
    if window is None or "sliding_attention" not in types:
        return dict(sliding_window=None, layer_types=None)
    return dict(sliding_window=window, layer_types=None if set(types) == {"sliding_attention"} else tuple(types))


def windows_to_hf(config: ModelConfig) -> Fields:
    """sliding_window + the explicit layer_types list (transformers' layout)."""
    return dict(sliding_window=config.sliding_window,
                layer_types=[config.layer_type(i) for i in range(config.n_layers)])


def uniform_windows(config: ModelConfig) -> str | None:
    """Why the sliding window of `config` is not the same on every layer (None if it is)."""
    kinds = {config.layer_type(i) for i in range(config.n_layers)}
    return None if len(kinds) == 1 else f"layer_types={config.layer_types} (one window for every layer needed)"
