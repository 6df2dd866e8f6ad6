"""Hugging Face config.json <-> ModelConfig for the Llama, Qwen2, Qwen3 and GPT-2 families.

Import reads the HF fields that change the math and refuses (ValueError naming the field) anything
scratchlm does not implement — RoPE scaling, partial rotary, sliding windows, quantization, GPT-2
attention-scale variants — so a model is never silently wrong. Fields that only matter to training
or to HF itself (dropout, use_cache, ...) are ignored.

    family   HF model_type   our config
    llama    "llama"         rmsnorm, swiglu (silu), rope "half", attention_bias -> q/k/v/o bias, mlp_bias
    qwen2    "qwen2"         as llama with q/k/v bias, no o bias
    qwen3    "qwen3"         as llama with qk_norm (q_norm/k_norm RMSNorm over Hd before RoPE)
    gpt2     "gpt2"          layernorm, mlp, learned positions, every bias, activation_function

Export picks the family from the config (`hf_family`) and adds a "scratchlm" entry holding the fields
HF has no slot for (rope_style, attn_impl, ops_impl, ffn_multiple_of) so scratchlm -> HF -> scratchlm is exact.
HF always pairs RoPE channels "half"-style; an "interleaved" model is exported with permuted q/k rows
(see hf_weights.py).
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig

HF_FAMILIES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                               "qwen3": "Qwen3ForCausalLM", "gpt2": "GPT2LMHeadModel"}
_BASE_ARCHS = {"llama": "LlamaModel", "qwen2": "Qwen2Model", "qwen3": "Qwen3Model", "gpt2": "GPT2Model"}
# HF activation_function (GPT-2) -> ours; the reverse map picks the first HF name for each of ours.
GPT2_ACTIVATIONS: dict[str, str] = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                                    "relu": "relu", "silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}
# head_dim when config.json omits it: HF's Qwen3Config defaults to 128, the others to D / H.
_DEFAULT_HEAD_DIM = {"qwen3": 128}
HINT_KEY = "scratchlm"
HINT_FIELDS = ("rope_style", "attn_impl", "ops_impl", "ffn_multiple_of")


def _unsupported(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"HF config field {field}={value!r} is not supported by scratchlm: {why}")


def _require(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ValueError(f"HF config is missing the required field {key!r} (model_type={hf.get('model_type')!r})")
    return hf[key]


def hf_family(hf: dict[str, Any]) -> str:
    """The family of an HF config dict, checking model_type and architectures."""
    model_type = hf.get("model_type")
    if model_type not in HF_FAMILIES:
        raise _unsupported("model_type", model_type, f"supported model types are {sorted(HF_FAMILIES)}")
    archs = hf.get("architectures") or []
    allowed = {HF_FAMILIES[model_type], _BASE_ARCHS[model_type]}
    bad = [a for a in archs if a not in allowed]
    if bad:
        raise _unsupported("architectures", bad, f"for {model_type!r} only {sorted(allowed)} are supported")
    return model_type


def _check_rope(hf: dict[str, Any]) -> float:
    """Return rope_theta; refuse scaled / partial / per-layer RoPE (new `rope_parameters` or old `rope_scaling`)."""
    for field in ("rope_parameters", "rope_scaling"):
        params = hf.get(field)
        if params is None:
            continue
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            raise _unsupported(field, params, "only one default RoPE for every layer is implemented")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise _unsupported(f"{field}.rope_type", rope_type,
                               "only the default (unscaled) RoPE is implemented; remove the scaling or "
                               "use a checkpoint without it")
        factor = params.get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            raise _unsupported(f"{field}.partial_rotary_factor", factor, "RoPE must rotate the whole head")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise _unsupported("partial_rotary_factor", hf["partial_rotary_factor"], "RoPE must rotate the whole head")
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = hf.get("rope_theta") or params.get("rope_theta") or 10000.0
    return float(theta)


def _check_common(hf: dict[str, Any]) -> None:
    """Refuse features that change the math and that scratchlm does not implement."""
    if hf.get("quantization_config"):
        raise _unsupported("quantization_config", hf["quantization_config"], "load an unquantized checkpoint")
    if hf.get("use_sliding_window"):
        raise _unsupported("use_sliding_window", True, "sliding-window attention is not implemented")
    layer_types = hf.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise _unsupported("layer_types", other, "only 'full_attention' layers are implemented")
    if hf.get("add_cross_attention"):
        raise _unsupported("add_cross_attention", True, "scratchlm is decoder-only")


def _rope_config(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """Fields shared by the RoPE families (llama, qwen2, qwen3)."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _unsupported("hidden_act", act, "the SwiGLU FFN of the llama/qwen families is implemented with 'silu' only")
    d_model, n_heads = _require(hf, "hidden_size"), _require(hf, "num_attention_heads")
    return dict(
        vocab_size=_require(hf, "vocab_size"), d_model=d_model, n_layers=_require(hf, "num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or _DEFAULT_HEAD_DIM.get(family) or d_model // n_heads,
        d_ff=_require(hf, "intermediate_size"),
        max_seq_len=_require(hf, "max_position_embeddings"), norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), ffn="swiglu", pos_embedding="rope", rope_style="half",
        rope_base=_check_rope(hf), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range") or 0.02),
    )


def _family_biases(hf: dict[str, Any], family: str) -> dict[str, Any]:
    if family == "qwen2":
        return dict(qkv_bias=True, attn_out_bias=False, mlp_bias=False)
    attention_bias = bool(hf.get("attention_bias", False))
    mlp_bias = bool(hf.get("mlp_bias", False)) if family == "llama" else False
    return dict(qkv_bias=attention_bias, attn_out_bias=attention_bias, mlp_bias=mlp_bias, qk_norm=family == "qwen3")


def _gpt2_config(hf: dict[str, Any]) -> dict[str, Any]:
    for field, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if hf.get(field, ok) != ok:
            raise _unsupported(field, hf[field], f"scratchlm's attention needs {field}={ok}")
    act = hf.get("activation_function", "gelu_new")
    if act not in GPT2_ACTIVATIONS:
        raise _unsupported("activation_function", act, f"supported: {sorted(GPT2_ACTIVATIONS)}")
    d_model = _require(hf, "n_embd")
    return dict(
        vocab_size=_require(hf, "vocab_size"), d_model=d_model, n_layers=_require(hf, "n_layer"),
        n_heads=_require(hf, "n_head"), d_ff=hf.get("n_inner") or 4 * d_model, max_seq_len=_require(hf, "n_positions"),
        norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), norm_bias=True, ffn="mlp",
        activation=GPT2_ACTIVATIONS[act], mlp_bias=True, qkv_bias=True, attn_out_bias=True,
        pos_embedding="learned", tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        init_std=float(hf.get("initializer_range") or 0.02),
    )


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig equal in math to the HF config dict `hf`; `overrides` (e.g. attn_impl) applied last."""
    family = hf_family(hf)
    _check_common(hf)
    if family == "gpt2":
        fields = _gpt2_config(hf)
    else:
        fields = {**_rope_config(hf, family), **_family_biases(hf, family)}
    hint = hf.get(HINT_KEY) or {}
    fields.update({k: hint[k] for k in HINT_FIELDS if k in hint})
    fields.update(overrides)
    return ModelConfig(**fields)


def export_family(config: ModelConfig) -> str:
    """The HF family that represents `config` exactly, or a ValueError saying which field prevents it."""
    if config.norm_placement != "pre":
        raise ValueError(f"cannot export norm_placement={config.norm_placement!r}: HF families are pre-norm")
    if config.pos_embedding == "learned":
        for field, want in (("norm", "layernorm"), ("ffn", "mlp"), ("qk_norm", False), ("n_kv_heads", config.n_heads),
                            ("head_dim", config.d_model // config.n_heads)):
            if getattr(config, field) != want:
                raise ValueError(f"cannot export a learned-position model with {field}={getattr(config, field)!r} "
                                 f"as GPT-2: GPT-2 needs {field}={want!r}")
        if config.activation not in GPT2_ACTIVATIONS.values():
            raise ValueError(f"cannot export activation={config.activation!r} as GPT-2")
        return "gpt2"
    if config.pos_embedding != "rope":
        raise ValueError(f"cannot export pos_embedding={config.pos_embedding!r}: HF families use 'rope' or 'learned'")
    for field, want in (("norm", "rmsnorm"), ("ffn", "swiglu")):
        if getattr(config, field) != want:
            raise ValueError(f"cannot export a RoPE model with {field}={getattr(config, field)!r}: "
                             f"Llama/Qwen need {field}={want!r}")
    if config.qk_norm:
        if config.mlp_bias:
            raise ValueError("cannot export qk_norm=True with mlp_bias=True: Qwen3 has no MLP bias")
        return "qwen3"
    standard_head = config.head_dim * config.n_heads == config.d_model
    if config.qkv_bias and not config.attn_out_bias and not config.mlp_bias and standard_head:
        return "qwen2"
    return "llama"


def hf_attention_bias(config: ModelConfig, family: str) -> bool:
    """Whether the exported HF model has q/k/v(/o) biases (missing ones are exported as zeros)."""
    return family in ("qwen2", "gpt2") or config.qkv_bias or config.attn_out_bias


def config_to_hf(config: ModelConfig, family: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """HF config.json dict for `config` exported as `family` (from `export_family`)."""
    common = dict(model_type=family, architectures=[HF_FAMILIES[family]], vocab_size=config.vocab_size,
                  tie_word_embeddings=config.tie_embeddings, initializer_range=config.init_std, dtype="float32",
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
    if family == "gpt2":
        act = next(k for k, v in GPT2_ACTIVATIONS.items() if v == config.activation)
        hf = dict(n_embd=config.d_model, n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
                  n_positions=config.max_seq_len, layer_norm_epsilon=config.norm_eps, activation_function=act,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        hf = dict(hidden_size=config.d_model, num_hidden_layers=config.n_layers,
                  num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
                  head_dim=config.head_dim, intermediate_size=config.d_ff, hidden_act="silu",
                  max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
                  rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
                  attention_dropout=0.0)
        if family != "qwen2":
            hf["attention_bias"] = hf_attention_bias(config, family)
        if family == "llama":
            hf["mlp_bias"] = config.mlp_bias
    hint = {k: getattr(config, k) for k in HINT_FIELDS}
    return {**common, **hf, **(extra or {}), HINT_KEY: hint}
