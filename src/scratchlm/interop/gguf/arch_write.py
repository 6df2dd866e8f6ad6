"""Export side of the architecture rows (architectures.py): per architecture, the ModelConfig values its llama.cpp
code hard-codes (`fixed_*`), the checks of what it would run differently (`check_*`), and the `{arch}.*` keys it
needs beyond the common ones (`keys_*`).

Keys are returned as {key: value} with the value's Python type giving the GGUF type llama.cpp demands (it checks
them strictly: llama-model-loader.cpp get_key): int -> UINT32, float -> FLOAT32, bool -> BOOL, str -> STRING,
list[bool] -> ARRAY of BOOL.
"""

from __future__ import annotations

import math
from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.rope_tensors import is_fixed_factors
from scratchlm.nn.rope_scaling import longrope_attention_factor, yarn_attention_factor

Fields = dict[str, Any]
YARN_DEFAULTS = {"beta_fast": 32, "beta_slow": 1, "truncate": True}  # what llama.cpp's YaRN always uses


def close(a: float, b: float) -> bool:
    """Float ModelConfig values against llama.cpp's (f32) constants: equal up to double rounding."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def effective_scale(c: ModelConfig) -> float:
    return c.attn_scale if c.attn_scale is not None else c.head_dim ** -0.5


def derived_scale(c: ModelConfig, big_model_layers: int) -> float:
    """gemma2/3: llama.cpp's attention scale, 1/sqrt(head_dim) (1/sqrt(D // heads) for the 27B layer count)."""
    return 1.0 / math.sqrt(c.d_model // c.n_heads if c.n_layers == big_model_layers else c.head_dim)


def sliding(c: ModelConfig) -> list[bool]:
    return [c.layer_window(i) is not None for i in range(c.n_layers)]


def yarn_magnitude(factor: float) -> float:
    """The attention factor llama.cpp's YaRN applies by itself: 0.1 ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0


def rope_keys(c: ModelConfig, arch: str, freqs_tensor: bool = False) -> Fields:
    """rope.scaling.* for c.rope_scaling (llama3, and fixed factors where the arch reads rope_freqs: no key, the
    tensor; longrope: L0 and llama.cpp's attn_factor, plus the type except for phi3, which always reads them)."""
    s = c.rope_scaling
    if s is None or c.pos_embedding != "rope":
        return {}
    kind = s["rope_type"]
    if kind == "linear":
        return {"rope.scaling.type": "linear", "rope.scaling.factor": float(s["factor"])}
    if kind == "yarn":
        out = {"rope.scaling.type": "yarn", "rope.scaling.factor": float(s["factor"]),
               "rope.scaling.original_context_length": int(s["original_max_position_embeddings"])}
        a = yarn_attention_factor(s) / yarn_magnitude(s["factor"])
        return {**out, "rope.scaling.attn_factor": float(a)} if not close(a, 1.0) else out
    if kind == "longrope" and not (freqs_tensor and is_fixed_factors(s, c.max_seq_len)):
        out = {"rope.scaling.original_context_length": int(s["original_max_position_embeddings"]),
               "rope.scaling.attn_factor": float(longrope_attention_factor(s, c.max_seq_len))}
        return out if arch == "phi3" else {"rope.scaling.type": "longrope", **out}
    return {}


def rope_problem(c: ModelConfig, kinds: frozenset[str]) -> str | None:
    """Why llama.cpp cannot run c's RoPE scaling for an architecture that reads `kinds`."""
    s = c.rope_scaling
    if s is None or c.pos_embedding != "rope":
        return None
    kind = s["rope_type"]
    if kind not in kinds:
        return f"rope_scaling type {kind!r} (llama.cpp runs {', '.join(sorted(kinds)) or 'no scaling'} here)"
    if kind == "yarn":
        bad = {k: s[k] for k, v in YARN_DEFAULTS.items() if s.get(k) is not None and s[k] != v}
        if bad:
            return f"YaRN {bad} (llama.cpp's YaRN always uses {YARN_DEFAULTS})"
    return None


def gemma_fixed(c: ModelConfig) -> Fields:
    return {"norm_unit_offset": True, "embedding_multiplier": c.d_model ** 0.5, "ffn": "glu",
            "activation": "gelu_tanh"}


def fixed_gemma2(c: ModelConfig) -> Fields:
    return {**gemma_fixed(c), "norm_placement": "sandwich"}


def fixed_gemma3(c: ModelConfig) -> Fields:
    return {**gemma_fixed(c), "norm_placement": "sandwich", "qk_norm": True, "qk_norm_scope": "head"}


def fixed_qk_head(c: ModelConfig) -> Fields:
    return {"qk_norm": True, "qk_norm_scope": "head"}


def fixed_olmo2(c: ModelConfig) -> Fields:
    return {"norm_placement": "output", "qk_norm": True, "qk_norm_scope": "projection"}


def fixed_smollm3(c: ModelConfig) -> Fields:
    return {"nope_layers": tuple(i for i in range(c.n_layers) if (i + 1) % 4 == 0)}


def _scale_problem(c: ModelConfig, big: int) -> str | None:
    want = derived_scale(c, big)
    if not close(effective_scale(c), want):
        return (f"attn_scale={c.attn_scale} (llama.cpp's gemma attention scale is {want:.6g}: "
                f"1/sqrt({'D / heads' if c.n_layers == big else 'head_dim'}), query_pre_attn_scalar is not read)")
    return None


def check_gemma2(c: ModelConfig) -> str | None:
    if c.attn_softcap is None or c.final_softcap is None:
        return (f"attn_softcap={c.attn_softcap}, final_softcap={c.final_softcap} (llama.cpp's gemma2 always caps "
                "both; it has no 'off')")
    if c.rope_local_base is not None and c.rope_scaling is not None and any(sliding(c)):
        return "rope_local_base with rope_scaling (llama.cpp's gemma2 scales the sliding layers' RoPE too)"
    return _scale_problem(c, 46)


def check_gemma3(c: ModelConfig) -> str | None:
    if c.attn_softcap is not None:
        return f"attn_softcap={c.attn_softcap} (llama.cpp's gemma3 has no attention soft-cap)"
    if any(sliding(c)) and c.rope_scaling is not None:
        if c.rope_local_base is None:
            return "rope_scaling with rope_local_base=None (llama.cpp's gemma3 sliding layers use unscaled RoPE)"
        a = rope_keys(c, "gemma3").get("rope.scaling.attn_factor", 1.0)
        if not close(a, 1.0):
            return f"a RoPE attention factor {a} (llama.cpp applies it to the sliding layers' RoPE too)"
    return _scale_problem(c, 62)


def check_olmo2(c: ModelConfig) -> str | None:
    """Sliding layers (OLMo-3) run plain RoPE of the global base: with rope_scaling scratchlm needs
    rope_local_base = rope_base to do the same; without, the local RoPE (if any) must be the global one."""
    if not any(sliding(c)):
        return None
    ok = (c.rope_base,) if c.rope_scaling is not None else (None, c.rope_base)
    if c.rope_local_base not in ok:
        return (f"rope_local_base={c.rope_local_base} (llama.cpp's olmo2 sliding layers use plain RoPE of the "
                f"global base {c.rope_base})")
    return None


def check_granite(c: ModelConfig) -> str | None:
    if c.pos_embedding not in ("rope", "none"):
        return f"pos_embedding={c.pos_embedding!r} (llama.cpp's granite has RoPE or, unfinetuned, none)"
    return None


def _swa_keys(c: ModelConfig) -> Fields:
    return {"attention.sliding_window": int(c.sliding_window), "attention.sliding_window_pattern": sliding(c)}


def keys_gemma2(c: ModelConfig) -> Fields:
    out = {"attention.sliding_window": int(c.sliding_window or 4096), "attention.sliding_window_pattern": sliding(c),
           "attn_logit_softcapping": float(c.attn_softcap), "final_logit_softcapping": float(c.final_softcap)}
    if c.rope_local_base is not None and any(sliding(c)):
        out["rope.freq_base_swa"] = float(c.rope_local_base)
    return out


def keys_gemma3(c: ModelConfig) -> Fields:
    out: Fields = {}
    if any(sliding(c)):
        local = c.rope_local_base if c.rope_local_base is not None else c.rope_base
        out.update(_swa_keys(c), **{"rope.freq_base_swa": float(local)})
    if c.final_softcap is not None:
        out["final_logit_softcapping"] = float(c.final_softcap)
    return out


def keys_olmo2(c: ModelConfig) -> Fields:
    return _swa_keys(c) if any(sliding(c)) else {}


def keys_granite(c: ModelConfig) -> Fields:
    out = {"logit_scale": float(c.logits_scaling), "embedding_scale": float(c.embedding_multiplier),
           "residual_scale": float(c.residual_multiplier), "attention.scale": float(effective_scale(c))}
    if c.pos_embedding == "none":
        out["rope.scaling.finetuned"] = False
    return out


def keys_moe(c: ModelConfig, width_key: bool, shared_key: bool) -> Fields:
    """expert_count / expert_used_count (+ the expert and shared-expert widths where the arch reads them)."""
    if not c.moe_num_experts:
        return {}
    out: Fields = {"expert_count": int(c.moe_num_experts), "expert_used_count": int(c.moe_top_k)}
    if width_key:
        out["expert_feed_forward_length"] = int(c.moe_d_ff)
    if shared_key:
        out["expert_shared_feed_forward_length"] = int(c.moe_shared_d_ff)
    return out
