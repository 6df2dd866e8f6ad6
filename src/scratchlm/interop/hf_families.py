"""The HF families as data: per model_type, its classes, how its config.json maps onto ModelConfig fields
(`read`), what it can represent (`fits`, a reason when not) and how a ModelConfig is written back (`write`).

    model_type  HF class               reads (besides the Llama-style sizes, norms, RoPE of hf_rope.py)
    llama       LlamaForCausalLM       attention_bias -> q/k/v/o bias, mlp_bias, hidden_act
    qwen2       Qwen2ForCausalLM       q/k/v bias (no o bias)
    qwen3       Qwen3ForCausalLM       attention_bias, qk_norm per head (q_norm/k_norm over Hd before RoPE)
    gpt2        GPT2LMHeadModel        layernorm, mlp, learned positions, every bias, activation_function

Everything else that changes the math and is not read here is refused by name (hf_config._check_common).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from scratchlm.config import ModelConfig
from scratchlm.interop.hf_rope import rope_from_hf, rope_to_hf, unsupported

# HF activation names (ACT2FN) -> ours; aliases of one function map to the same name. The reverse map
# picks the first HF name for each of ours.
HF_ACTIVATIONS: dict[str, str] = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                                  "gelu": "gelu", "gelu_python": "gelu", "relu": "relu", "silu": "silu",
                                  "swish": "silu", "sigmoid": "sigmoid"}
HF_ACTIVATION_NAMES = {ours: hf for hf, ours in reversed(list(HF_ACTIVATIONS.items()))}

Fields = dict[str, Any]


def require(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ValueError(f"HF config is missing the required field {key!r} (model_type={hf.get('model_type')!r})")
    return hf[key]


def activation(hf: dict[str, Any], key: str, default: str) -> str:
    """Our name for the HF activation under `key` (aliases such as swish = silu accepted)."""
    act = hf.get(key) or default
    if act not in HF_ACTIVATIONS:
        raise unsupported(key, act, f"supported activations: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[act]


def rope_sizes(hf: dict[str, Any], family: str, default_theta: float = 10_000.0,
               default_head_dim: int | None = None) -> Fields:
    """The fields every Llama-style RoPE family shares: sizes, RMSNorm, gated FFN, RoPE, head."""
    d_model, n_heads = require(hf, "hidden_size"), require(hf, "num_attention_heads")
    act = activation(hf, "hidden_act", "silu")
    fields = dict(
        vocab_size=require(hf, "vocab_size"), d_model=d_model, n_layers=require(hf, "num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or default_head_dim or d_model // n_heads, d_ff=require(hf, "intermediate_size"),
        max_seq_len=require(hf, "max_position_embeddings"), norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        ffn="swiglu", pos_embedding="rope", rope_style="half",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), init_std=float(hf.get("initializer_range") or 0.02),
        hf_family=family,
    )
    if act != "silu":
        raise unsupported("hidden_act", hf.get("hidden_act"), f"the gated FFN of {family!r} is implemented with "
                          "'silu' (= 'swish') only")
    return {**fields, **rope_from_hf(hf, family, default_theta)}


def rope_sizes_to_hf(config: ModelConfig) -> Fields:
    out = dict(hidden_size=config.d_model, num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
               num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim, intermediate_size=config.d_ff,
               hidden_act="silu", max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
               attention_dropout=0.0)
    return {**out, **rope_to_hf(config)}  # rope_to_hf may set max_position_embeddings (dynamic NTK)


def _rope_llama_like(config: ModelConfig) -> str | None:
    """Why `config` is no plain Llama-style RoPE model (None if it is one)."""
    for name, want in (("pos_embedding", "rope"), ("norm", "rmsnorm"), ("ffn", "swiglu"), ("norm_placement", "pre")):
        if getattr(config, name) != want:
            return f"{name}={getattr(config, name)!r} (needs {want!r})"
    return None


# ---- llama / qwen2 / qwen3 -------------------------------------------------------------------------------

def _read_llama(hf: dict[str, Any]) -> Fields:
    bias = bool(hf.get("attention_bias", False))
    return {**rope_sizes(hf, "llama"), "qkv_bias": bias, "attn_out_bias": bias, "mlp_bias": bool(hf.get("mlp_bias"))}


def _write_llama(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "attention_bias": config.qkv_bias or config.attn_out_bias,
            "mlp_bias": config.mlp_bias}


def _fits_llama(config: ModelConfig) -> str | None:
    return _rope_llama_like(config) or ("qk_norm=True (Llama has no QK-norm)" if config.qk_norm else None)


def _read_qwen2(hf: dict[str, Any]) -> Fields:
    return {**rope_sizes(hf, "qwen2"), "qkv_bias": True, "attn_out_bias": False, "mlp_bias": False}


def _fits_qwen2(config: ModelConfig) -> str | None:
    for name, want in (("qkv_bias", True), ("attn_out_bias", False), ("mlp_bias", False), ("qk_norm", False),
                       ("head_dim", config.d_model // config.n_heads)):
        if getattr(config, name) != want:
            return f"{name}={getattr(config, name)!r} (Qwen2 needs {want!r})"
    return _rope_llama_like(config)


def _write_qwen2(config: ModelConfig) -> Fields:
    return rope_sizes_to_hf(config)


def _read_qwen3(hf: dict[str, Any]) -> Fields:
    bias = bool(hf.get("attention_bias", False))
    return {**rope_sizes(hf, "qwen3", default_head_dim=128), "qkv_bias": bias, "attn_out_bias": bias,
            "mlp_bias": False, "qk_norm": True}


def _fits_qwen3(config: ModelConfig) -> str | None:
    if not config.qk_norm or config.mlp_bias:
        return f"qk_norm={config.qk_norm}, mlp_bias={config.mlp_bias} (Qwen3 needs QK-norm and no MLP bias)"
    return _rope_llama_like(config)


def _write_qwen3(config: ModelConfig) -> Fields:
    return {**rope_sizes_to_hf(config), "attention_bias": config.qkv_bias or config.attn_out_bias}


# ---- gpt2 -------------------------------------------------------------------------------------------------

def _read_gpt2(hf: dict[str, Any]) -> Fields:
    for field, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if hf.get(field, ok) != ok:
            raise unsupported(field, hf[field], f"scratchlm's attention needs {field}={ok}")
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
    for name, want in (("pos_embedding", "learned"), ("norm", "layernorm"), ("ffn", "mlp"), ("qk_norm", False),
                       ("norm_placement", "pre"), ("n_kv_heads", config.n_heads),
                       ("head_dim", config.d_model // config.n_heads)):
        if getattr(config, name) != want:
            return f"{name}={getattr(config, name)!r} (GPT-2 needs {want!r})"
    return None


def _write_gpt2(config: ModelConfig) -> Fields:
    return dict(n_embd=config.d_model, n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
                n_positions=config.max_seq_len, layer_norm_epsilon=config.norm_eps,
                activation_function=HF_ACTIVATION_NAMES[config.activation], resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0)


@dataclass(frozen=True)
class Family:
    """One HF model_type: its classes and its config mapping (see the module docstring)."""

    causal_lm: str
    base_model: str
    read: Callable[[dict[str, Any]], Fields]
    fits: Callable[[ModelConfig], str | None]
    write: Callable[[ModelConfig], Fields]
    attention_bias: Callable[[ModelConfig], bool]  # whether the HF model has q/k/v(/o) biases


FAMILIES: dict[str, Family] = {
    "gpt2": Family("GPT2LMHeadModel", "GPT2Model", _read_gpt2, _fits_gpt2, _write_gpt2, lambda c: True),
    "qwen3": Family("Qwen3ForCausalLM", "Qwen3Model", _read_qwen3, _fits_qwen3, _write_qwen3,
                    lambda c: c.qkv_bias or c.attn_out_bias),
    "qwen2": Family("Qwen2ForCausalLM", "Qwen2Model", _read_qwen2, _fits_qwen2, _write_qwen2, lambda c: True),
    "llama": Family("LlamaForCausalLM", "LlamaModel", _read_llama, _fits_llama, _write_llama,
                    lambda c: c.qkv_bias or c.attn_out_bias),
}
# export tries the families in this order (the most specific first) when the config names none
EXPORT_ORDER = ("gpt2", "qwen3", "qwen2", "llama")
