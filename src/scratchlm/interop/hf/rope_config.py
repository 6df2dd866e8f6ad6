"""RoPE settings of an HF config.json <-> ModelConfig (rope_base, rope_scaling, rope_local_base).

transformers (v5) reads one dict per layer type, in this order of priority (tested against it):
    params = rope_scaling (the old key) or rope_parameters or {}
    rope_type = params["rope_type"] or params["type"] or "default"
    theta = params["rope_theta"], else the top-level rope_theta, else the family's default theta
    original_max_position_embeddings (llama3, yarn, longrope) = params[...], else max_position_embeddings
        (Phi-3 only: a top-level original_max_position_embeddings wins over the dict)
    dynamic NTK always uses max_position_embeddings as its original length
Keys a rope type does not use are ignored, as transformers does. Phi-3 reads the legacy types "su" and
"yarn" as "longrope". Gemma-3 keeps one dict per layer type: full_attention (may be scaled, top-level
rope_theta / rope_scaling) and sliding_attention (rope_local_base_freq); scratchlm supports an unscaled
local RoPE with its own base.

A dynamic-NTK model gets max_seq_len = factor * max_position_embeddings (the context it is made to reach);
on export max_position_embeddings is its original length again.
"""

from __future__ import annotations

import math
from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.nn.rope_scaling import ROPE_SCALING_KEYS


def unsupported(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"HF config field {field}={value!r} is not supported by scratchlm: {why}")


def _rope_type(params: dict[str, Any], family: str) -> str:
    kind = params.get("rope_type") or params.get("type") or "default"
    if family == "phi3" and kind in ("su", "yarn"):
        return "longrope"
    return kind


PARTIAL_ROTARY_FAMILIES = ("phi3",)  # whose attention rotates only the first int(Hd * factor) dims


def _check_partial(hf: dict[str, Any], params: dict[str, Any], field: str, family: str = "") -> float:
    """partial_rotary_factor (dict first, then top level); refused where the family's RoPE cannot rotate part."""
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    factor = 1.0 if factor is None else factor
    if factor != 1.0 and family not in PARTIAL_ROTARY_FAMILIES:
        raise unsupported(f"{field}.partial_rotary_factor", factor, "RoPE must rotate the whole head for "
                          f"model_type {family!r} (partial rotary is read for {PARTIAL_ROTARY_FAMILIES})")
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise unsupported(f"{field}.partial_rotary_factor", factor, "expected a number in (0, 1]")
    return float(factor)


def _scaling(hf: dict[str, Any], params: dict[str, Any], family: str, field: str) -> dict[str, Any] | None:
    """rope_scaling dict (ModelConfig layout) of one HF rope dict, or None for plain RoPE."""
    kind = _rope_type(params, family)
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_KEYS:
        raise unsupported(f"{field}.rope_type", kind, f"supported RoPE types are default, {sorted(ROPE_SCALING_KEYS)}")
    required, optional = ROPE_SCALING_KEYS[kind]
    missing = sorted(k for k in required - {"original_max_position_embeddings"} if params.get(k) is None)
    if missing:
        raise ValueError(f"HF config field {field} (rope_type {kind!r}) is missing {missing}; transformers refuses it too")
    out = {"rope_type": kind, **{k: params[k] for k in sorted(required | optional) if params.get(k) is not None}}
    if "original_max_position_embeddings" not in required:
        out.pop("original_max_position_embeddings", None)
    elif kind == "dynamic":
        out["original_max_position_embeddings"] = hf["max_position_embeddings"]
    elif family == "phi3" and hf.get("original_max_position_embeddings") is not None:
        out["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    else:
        out.setdefault("original_max_position_embeddings", hf["max_position_embeddings"])
    return out


def _theta(hf: dict[str, Any], params: dict[str, Any], default: float, top_key: str = "rope_theta") -> float:
    theta = params["rope_theta"] if "rope_theta" in params else hf.get(top_key, default)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 1:
        raise unsupported("rope_theta", theta, "the RoPE base must be a number > 1")
    return float(theta)


def rope_from_hf(hf: dict[str, Any], family: str, default_theta: float, head_dim: int) -> dict[str, Any]:
    """ModelConfig fields rope_base, rope_scaling, rotary_dim (+ rope_local_base for Gemma-3, max_seq_len for
    dynamic NTK)."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise unsupported("rope_parameters", params, "expected a dict")
    if family == "gemma3_text":
        return _gemma3_rope(hf, params)
    if any(isinstance(v, dict) for v in params.values()):
        raise unsupported("rope_parameters", params, f"per-layer-type RoPE is not read for model_type {family!r}")
    partial = _check_partial(hf, params, "rope_parameters", family)
    scaling = _scaling(hf, params, family, "rope_parameters")
    out: dict[str, Any] = dict(rope_base=_theta(hf, params, default_theta), rope_scaling=scaling,
                               rotary_dim=int(head_dim * partial))
    if scaling is not None and scaling["rope_type"] == "dynamic":
        out["max_seq_len"] = int(math.floor(scaling["factor"] * hf["max_position_embeddings"]))
    return out


def _gemma3_rope(hf: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    nested = params if any(isinstance(v, dict) for v in params.values()) else {"full_attention": params}
    full = dict(nested.get("full_attention") or {})
    local = dict(nested.get("sliding_attention") or {})
    if hf.get("rope_scaling") and hf.get("rope_parameters"):  # the old key updates the nested full dict
        full = {**(hf["rope_parameters"].get("full_attention") or {}), **hf["rope_scaling"]}
    for name, p in (("full_attention", full), ("sliding_attention", local)):
        _check_partial(hf, p, f"rope_parameters.{name}")
    if _rope_type(local, "gemma3_text") != "default":
        raise unsupported("rope_parameters.sliding_attention.rope_type", _rope_type(local, "gemma3_text"),
                          "the local (sliding-window) RoPE must be unscaled")
    scaling = _scaling(hf, full, "gemma3_text", "rope_parameters.full_attention")
    if scaling is not None and scaling["rope_type"] == "dynamic":
        raise unsupported("rope_parameters.full_attention.rope_type", "dynamic", "not read for Gemma-3")
    return dict(rope_base=_theta(hf, full, 1_000_000.0),
                rope_local_base=_theta(hf, local, 10_000.0, top_key="rope_local_base_freq"),
                rope_scaling=scaling)


def rope_to_hf(config: ModelConfig) -> dict[str, Any]:
    """HF fields for the RoPE of `config`: rope_parameters (+ max_position_embeddings for dynamic NTK)."""
    params = {"rope_type": "default", "rope_theta": config.rope_base}
    out: dict[str, Any] = {}
    if config.rope_scaling is not None:
        params = {**config.rope_scaling, "rope_theta": config.rope_base}
        if params["rope_type"] == "dynamic":
            out["max_position_embeddings"] = params.pop("original_max_position_embeddings")
    if config.rotary_dim is not None:
        params["partial_rotary_factor"] = config.rotary_dim / config.head_dim
    out["rope_parameters"] = params
    if getattr(config, "rope_local_base", None) is not None:
        out["rope_parameters"] = {"full_attention": params,
                                  "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_local_base}}
    return out
