"""GGUF metadata -> the HF config.json dict of the same model (then `hf_config.config_from_hf` -> ModelConfig).

llama.cpp names hyper-parameters `{arch}.{key}`; the mapping to HF's names is a table, and the features
scratchlm does not implement are refused by name, never loaded as a different model:

    GGUF key ({arch}.)                 HF config.json            notes
    block_count                        num_hidden_layers
    context_length                     max_position_embeddings
    embedding_length                   hidden_size
    feed_forward_length                intermediate_size
    attention.head_count               num_attention_heads        per-layer arrays are refused
    attention.head_count_kv            num_key_value_heads        default: head_count (MHA)
    attention.key_length               head_dim                   default: embedding_length / head_count
    attention.layer_norm_rms_epsilon   rms_norm_eps
    rope.freq_base                     rope_theta                 default 10000
    rope.dimension_count               (must equal head_dim: partial rotary is refused)
    vocab_size                         vocab_size                 default: len(tokenizer.ggml.tokens)
Tensors fill in the rest: no `output.weight` -> tie_word_embeddings; `blk.0.attn_q.bias` -> attention_bias
(llama) / always (qwen2); `blk.0.ffn_up.bias` -> mlp_bias (llama).
"""

from __future__ import annotations

from typing import Any

from scratchlm.interop.hf.config_json import HF_FAMILIES

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_HF_KEYS = {
    "block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta", "vocab_size": "vocab_size",
}
_REQUIRED = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
             "attention.layer_norm_rms_epsilon")
# {arch}.KEY present with a value other than the harmless one -> refused (what it would change).
_REFUSED = {
    "expert_count": (0, "mixture-of-experts layers are not implemented"),
    "attention.sliding_window": (0, "sliding-window attention is not implemented"),
    "rope.scaling.type": ("none", "only the default (unscaled) RoPE is implemented"),
    "rope.scaling.factor": (1.0, "only the default (unscaled) RoPE is implemented"),
    "attention.clamp_kqv": (0.0, "clamped q/k/v are not implemented"),
    "attn_logit_softcapping": (0.0, "attention logit soft-capping is not implemented"),
    "final_logit_softcapping": (0.0, "final logit soft-capping is not implemented"),
}


def _unsupported(key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"GGUF metadata {key}={value!r} is not supported by scratchlm: {why}")


def gguf_architecture(metadata: dict[str, Any]) -> str:
    """general.architecture, checked against the architectures scratchlm loads."""
    arch = metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise _unsupported("general.architecture", arch, f"supported architectures: {', '.join(GGUF_ARCHITECTURES)}")
    return arch


def _check_refused(metadata: dict[str, Any], arch: str) -> None:
    for key, (harmless, why) in _REFUSED.items():
        value = metadata.get(f"{arch}.{key}")
        if value is not None and value != harmless:
            raise _unsupported(f"{arch}.{key}", value, why)


def _hf_values(metadata: dict[str, Any], arch: str) -> dict[str, Any]:
    missing = [f"{arch}.{k}" for k in _REQUIRED if f"{arch}.{k}" not in metadata]
    if missing:
        raise ValueError(f"GGUF file lacks the metadata {missing}; it does not describe a complete {arch} model")
    hf: dict[str, Any] = {}
    for key, hf_key in _HF_KEYS.items():
        value = metadata.get(f"{arch}.{key}")
        if isinstance(value, list):
            raise _unsupported(f"{arch}.{key}", value[:4], "per-layer values are not implemented")
        if value is not None:
            hf[hf_key] = value
    return hf


def _check_head_dims(metadata: dict[str, Any], arch: str, head_dim: int) -> None:
    value_length = metadata.get(f"{arch}.attention.value_length")
    if value_length is not None and value_length != head_dim:
        raise _unsupported(f"{arch}.attention.value_length", value_length,
                           f"keys and values must share head_dim={head_dim}")
    rotary = metadata.get(f"{arch}.rope.dimension_count")
    if rotary is not None and rotary != head_dim:
        raise _unsupported(f"{arch}.rope.dimension_count", rotary,
                           f"RoPE must rotate the whole head (head_dim={head_dim}); partial rotary is not implemented")


def hf_config_from_gguf(metadata: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """The HF config.json dict describing the same model as this GGUF metadata + tensor list."""
    arch = gguf_architecture(metadata)
    _check_refused(metadata, arch)
    if "rope_freqs.weight" in tensor_names:
        raise ValueError("GGUF tensor rope_freqs.weight (Llama-3.1-style RoPE frequency scaling) is not supported "
                         "by scratchlm: only the default (unscaled) RoPE is implemented")
    hf = {"model_type": arch, "architectures": [HF_FAMILIES[arch]], "hidden_act": "silu", **_hf_values(metadata, arch)}
    hf.setdefault("num_key_value_heads", hf["num_attention_heads"])
    hf.setdefault("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
    hf.setdefault("rope_theta", 10000.0)
    if "vocab_size" not in hf:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ValueError(f"GGUF file has neither {arch}.vocab_size nor tokenizer.ggml.tokens; vocabulary size unknown")
        hf["vocab_size"] = len(tokens)
    _check_head_dims(metadata, arch, hf["head_dim"])
    hf["tie_word_embeddings"] = "output.weight" not in tensor_names
    if arch == "llama":
        hf["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
        hf["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    hf["rope_theta"] = float(hf["rope_theta"])
    hf["rms_norm_eps"] = float(hf["rms_norm_eps"])
    return hf
