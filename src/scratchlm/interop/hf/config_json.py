"""Hugging Face config.json <-> ModelConfig (the per-family mappings are data in families.py).

Import reads the HF fields that change the math and refuses (ValueError naming the field) anything
scratchlm does not implement — partial rotary, quantization, unsupported layer types — so a model is never
silently wrong. Fields that only matter to training or to HF itself (dropout, use_cache, ...) and options
the family's HF code ignores are ignored.

Export: the family is `config.hf_family` (set on import) when it can represent the config, else the first
family of families.EXPORT_ORDER that can; a "scratchlm" entry holds the fields HF has no slot for
(rope_style, attn_impl, ops_impl, ffn_multiple_of) so scratchlm -> HF -> scratchlm is exact.
HF always pairs RoPE channels "half"-style; an "interleaved" model is exported with permuted q/k rows
(see state_dict.py).
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.family_helpers import HF_ACTIVATIONS
from scratchlm.interop.hf.families import EXPORT_ORDER, FAMILIES
from scratchlm.interop.hf.rope_config import unsupported

HF_FAMILIES: dict[str, str] = {name: f.causal_lm for name, f in FAMILIES.items()}
# vision-language checkpoints whose text model scratchlm loads: model_type -> (class, text model_type,
# weight prefix of the text model); the vision tower and projector are not loaded (from_pretrained warns)
VLM_TEXT = {"gemma3": ("Gemma3ForConditionalGeneration", "gemma3_text", "language_model.")}
HINT_KEY = "scratchlm"
HINT_FIELDS = ("rope_style", "attn_impl", "ops_impl", "ffn_multiple_of")
__all__ = ["HF_ACTIVATIONS", "HF_FAMILIES", "HINT_KEY", "config_from_hf", "config_to_hf", "export_family",
           "hf_attention_bias", "hf_family"]


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The config dict of the text model: `hf` itself, or a vision-language model's text_config (whose head
    ties as the top-level tie_word_embeddings says, as transformers ties it)."""
    vlm = VLM_TEXT.get(hf.get("model_type"))
    if vlm is None:
        return hf
    bad = [a for a in hf.get("architectures") or [] if a != vlm[0]]
    if bad or not isinstance(hf.get("text_config"), dict):
        raise unsupported("architectures", bad or hf.get("architectures"),
                          f"for {hf['model_type']!r} only {vlm[0]} with a text_config is supported")
    return {**hf["text_config"], "model_type": vlm[1], "architectures": None,
            "tie_word_embeddings": hf.get("tie_word_embeddings", True)}


def hf_family(hf: dict[str, Any]) -> str:
    """The family of an HF config dict (a vision-language model's: its text model's), checking model_type
    and architectures."""
    hf = text_config(hf)
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise unsupported("model_type", model_type, f"supported model types are {sorted(FAMILIES)}")
    archs = hf.get("architectures") or []
    allowed = {FAMILIES[model_type].causal_lm, FAMILIES[model_type].base_model}
    bad = [a for a in archs if a not in allowed]
    if bad:
        raise unsupported("architectures", bad, f"for {model_type!r} only {sorted(allowed)} are supported")
    return model_type


def _check_common(hf: dict[str, Any]) -> None:
    """Refuse features that change the math and that scratchlm does not implement."""
    if hf.get("quantization_config"):
        raise unsupported("quantization_config", hf["quantization_config"], "load an unquantized checkpoint")
    other = sorted({t for t in hf.get("layer_types") or [] if t not in ("full_attention", "sliding_attention")})
    if other:
        raise unsupported("layer_types", other, "only 'full_attention' and 'sliding_attention' layers are implemented")
    if hf.get("add_cross_attention"):
        raise unsupported("add_cross_attention", True, "scratchlm is decoder-only")


def config_from_hf(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig equal in math to the HF config dict `hf`; `overrides` (e.g. attn_impl) applied last."""
    family = hf_family(hf)
    hf = text_config(hf)
    _check_common(hf)
    fields = FAMILIES[family].read(hf)
    hint = hf.get(HINT_KEY) or {}
    fields.update({k: hint[k] for k in (*HINT_FIELDS, "max_seq_len") if k in hint})
    fields.update(overrides)
    return ModelConfig(**fields)


def export_family(config: ModelConfig) -> str:
    """The HF family that represents `config` exactly, or a ValueError saying which field prevents it."""
    preferred = config.hf_family if config.hf_family in FAMILIES else None
    if preferred is not None and FAMILIES[preferred].fits(config) is None:
        return preferred
    reasons = {}
    for name in EXPORT_ORDER:
        reason = FAMILIES[name].fits(config)
        if reason is None:
            return name
        reasons[name] = reason
    raise ValueError("cannot export this config to a Hugging Face family: "
                     + "; ".join(f"{name}: {why}" for name, why in reasons.items()))


def hf_attention_bias(config: ModelConfig, family: str) -> bool:
    """Whether the exported HF model has q/k/v(/o) biases (missing ones are exported as zeros)."""
    return FAMILIES[family].attention_bias(config)


def config_to_hf(config: ModelConfig, family: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """HF config.json dict for `config` exported as `family` (from `export_family`)."""
    common = dict(model_type=family, architectures=[FAMILIES[family].causal_lm], vocab_size=config.vocab_size,
                  tie_word_embeddings=config.tie_embeddings, initializer_range=config.init_std, dtype="float32",
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
    hint = {k: getattr(config, k) for k in HINT_FIELDS}
    if config.rope_scaling is not None and config.rope_scaling["rope_type"] == "dynamic":
        hint["max_seq_len"] = config.max_seq_len  # HF's max_position_embeddings is the original length
    return {**common, **FAMILIES[family].write(config), **(extra or {}), HINT_KEY: hint}
