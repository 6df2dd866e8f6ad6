"""Read a GGUF file's `{arch}.*` metadata (+ its tensor list) into ModelConfig fields, as llama.cpp reads it.

llama.cpp's defaults apply, not transformers' (rope.freq_base 10000, key_length = embedding_length /
head_count, gemma2's window 4096 and soft-caps 50 / 30, ...), and keys an architecture's llama.cpp code does
not read are ignored, as llama.cpp ignores them (a `llama.attention.sliding_window` runs full attention there).
What a key asks for that scratchlm cannot compute is refused by name (`unsupported`).

    common_fields   every architecture: sizes, RMSNorm eps, RoPE base and scaling (rope.scaling.* and the
                    factor tensors of rope_tensors.py), biases and the tied head from the tensor list
    read_*          one per architecture row of architectures.py: the fields its llama.cpp code adds
"""

from __future__ import annotations

import math
from typing import Any

import torch

from scratchlm.interop.gguf.rope_tensors import longrope_from_factors, scaling_from_rope_freqs

Fields = dict[str, Any]
_MISSING = object()


def unsupported(key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"GGUF metadata {key}={value!r} is not supported by scratchlm: {why}")


class ArchMeta:
    """One file's `{arch}.*` metadata, tensor shapes and the small tensors read with the metadata (the RoPE
    factor tables); values type-checked, per-layer arrays accepted when every layer has the same value."""

    def __init__(self, arch: str, metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                 small: dict[str, torch.Tensor] | None = None) -> None:
        self.arch, self.metadata, self.shapes, self.small = arch, metadata, shapes, small or {}

    def raw(self, key: str) -> Any:
        return self.metadata.get(f"{self.arch}.{key}")

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.metadata

    def _get(self, key: str, default: Any, ok: Any, words: str) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.metadata:
            if default is _MISSING:
                raise ValueError(f"GGUF file lacks the metadata {full}; it does not describe a complete "
                                 f"{self.arch} model (llama.cpp requires it too)")
            return default
        value = self.metadata[full]
        if isinstance(value, list) and words == "an integer":  # per-layer values: one per layer, all equal
            if not value or len(set(value)) != 1:
                raise unsupported(full, value[:8], "per-layer values that differ between layers are not implemented")
            value = value[0]
        if not ok(value):
            raise ValueError(f"GGUF metadata {full}={value!r} must be {words}")
        return value

    def count(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                         "an integer")

    def number(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                          and math.isfinite(v), "a number")
        return value if value is None else float(value)

    def flag(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, lambda v: isinstance(v, bool), "a bool")

    def text(self, key: str, default: Any = _MISSING) -> Any:
        return self._get(key, default, lambda v: isinstance(v, str), "a string")

    def n_layers(self) -> int:
        return self.count("block_count")

    def any_layer(self, kind: str, suffix: str = "weight") -> bool:
        """True when some layer holds blk.N.{kind}.{suffix}."""
        return any(f"blk.{i}.{kind}.{suffix}" in self.shapes for i in range(self.n_layers()))


def _bias_fields(m: ArchMeta) -> Fields:
    """Biases as the tensors say (any layer; the missing ones are zeros, which llama.cpp's null bias is)."""
    return {"qkv_bias": any(m.any_layer(k, "bias") for k in ("attn_q", "attn_k", "attn_v", "attn_qkv")),
            "attn_out_bias": m.any_layer("attn_output", "bias"),
            "mlp_bias": any(m.any_layer(k, "bias") for k in ("ffn_gate", "ffn_up", "ffn_down"))}


def _heads(m: ArchMeta) -> Fields:
    d_model, n_heads = m.count("embedding_length"), m.count("attention.head_count")
    if n_heads == 0:
        raise unsupported(f"{m.arch}.attention.head_count", 0, "a model without attention heads")
    n_kv = m.count("attention.head_count_kv", n_heads)
    head_dim = m.count("attention.key_length", d_model // n_heads)
    value_dim = m.count("attention.value_length", d_model // n_heads)
    if value_dim != head_dim:
        raise unsupported(f"{m.arch}.attention.value_length", value_dim,
                          f"keys and values must share head_dim (attention.key_length={head_dim})")
    for key, full in (("attention.key_length_swa", head_dim), ("attention.value_length_swa", head_dim)):
        if m.count(key, full) != full:
            raise unsupported(f"{m.arch}.{key}", m.raw(key), "sliding-window layers with their own head size")
    return dict(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv or n_heads, head_dim=head_dim)


def _rotary_dim(m: ArchMeta, head_dim: int, partial_ok: bool) -> int:
    rot = m.count("rope.dimension_count", head_dim)
    if m.count("rope.dimension_count_swa", rot) != rot:
        raise unsupported(f"{m.arch}.rope.dimension_count_swa", m.raw("rope.dimension_count_swa"),
                          "sliding-window layers with their own rotary size")
    if rot != head_dim and not (partial_ok and 0 < rot < head_dim and rot % 2 == 0):
        raise unsupported(f"{m.arch}.rope.dimension_count", rot, f"RoPE must rotate the whole head (head_dim="
                          f"{head_dim}); partial rotary is read for phi3 only")
    return rot


def _rope_scaling(m: ArchMeta, rot: int, base: float, max_seq_len: int) -> dict[str, Any] | None:
    """rope.scaling.* and the factor tensors -> rope_scaling (llama.cpp: llama-model.cpp load_hparams)."""
    kind = m.text("rope.scaling.type", "linear")
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise unsupported(f"{m.arch}.rope.scaling.type", kind, "llama.cpp knows none, linear, yarn and longrope "
                          "(it aborts on any other)")
    factor = m.number("rope.scaling.factor", None)
    factor = m.number("rope.scale_linear", 0.0) if factor is None else factor
    attn = m.number("rope.scaling.attn_factor", 1.0)
    l0 = m.count("rope.scaling.original_context_length", max_seq_len)
    scale = 1.0 if kind == "none" or factor == 0.0 else factor
    long, short = m.small.get("rope_factors_long.weight"), m.small.get("rope_factors_short.weight")
    table = m.small.get("rope_freqs.weight")
    longrope = kind == "longrope" or m.arch == "phi3"  # phi3 creates the factor tensors whatever the type
    if ((long is not None or short is not None) and not longrope) or (table is not None and kind == "longrope"):
        raise ValueError(f"GGUF file of architecture {m.arch!r} with rope.scaling.type={kind!r} holds "
                         f"{'rope_freqs' if kind == 'longrope' else 'rope_factors_long/short'} tensors, which llama.cpp "
                         "does not create for it (it refuses the file); scratchlm does too")
    if kind == "longrope" or (m.arch == "phi3" and (long is not None or short is not None)):
        if scale != 1.0:
            raise unsupported(f"{m.arch}.rope.scaling.factor", factor, "longrope factor tensors with a linear factor")
        return longrope_from_factors(long, short, rot, l0, attn)
    if kind == "yarn":
        if table is not None:
            raise ValueError("GGUF tensor rope_freqs.weight together with YaRN scaling is not supported by scratchlm")
        magnitude = attn * (1 + 0.1 * math.log(scale) if scale > 1 else 1.0)  # llama-context.cpp + ggml rope_yarn
        return {"rope_type": "yarn", "factor": scale, "original_max_position_embeddings": l0,
                "attention_factor": magnitude}
    if attn != 1.0:
        raise unsupported(f"{m.arch}.rope.scaling.attn_factor", attn, f"an attention factor with {kind!r} RoPE")
    if table is not None:
        if scale != 1.0:
            raise unsupported(f"{m.arch}.rope.scaling.factor", factor, "a linear factor together with the "
                              "rope_freqs.weight factor table")
        return scaling_from_rope_freqs(table, base, rot, max_seq_len,
                                       m.count("rope.scaling.original_context_length", None))
    return None if scale == 1.0 else {"rope_type": "linear", "factor": scale}


def common_fields(m: ArchMeta, partial_rotary: bool = False) -> Fields:
    """The fields every architecture shares (module docstring)."""
    if m.flag("attention.causal", True) is not True:
        raise unsupported(f"{m.arch}.attention.causal", False, "scratchlm is a causal decoder")
    for key, harmless in (("expert_group_count", 1), ("nextn_predict_layers", 0)):
        if m.count(key, 0) > harmless:
            raise unsupported(f"{m.arch}.{key}", m.raw(key), "expert groups and next-token-prediction layers are "
                              "not implemented")
    heads = _heads(m)
    n_layers, max_seq_len = m.n_layers(), m.count("context_length")
    if "token_embd.weight" not in m.shapes:
        raise ValueError("GGUF file has no token_embd.weight tensor; it does not describe a complete model")
    rot = _rotary_dim(m, heads["head_dim"], partial_rotary)
    base = m.number("rope.freq_base", 10_000.0)
    return dict(
        vocab_size=m.shapes["token_embd.weight"][0], n_layers=n_layers, **heads, d_ff=m.count("feed_forward_length", 0),
        max_seq_len=max_seq_len, norm="rmsnorm", norm_eps=m.number("attention.layer_norm_rms_epsilon"),
        pos_embedding="rope", rope_style="half", rope_base=base, rotary_dim=rot,
        rope_scaling=_rope_scaling(m, rot, base, max_seq_len), ffn="swiglu",
        tie_embeddings="output.weight" not in m.shapes, **_bias_fields(m),
    )


def derived_attn_scale(fields: Fields, big_model_layers: int) -> float:
    """gemma2/3: 1/sqrt(head_dim), or 1/sqrt(D / n_heads) (integer division) for the 27B layer count."""
    if fields["n_layers"] == big_model_layers:
        return 1.0 / math.sqrt(fields["d_model"] // fields["n_heads"])
    return 1.0 / math.sqrt(fields["head_dim"])


def swa_layers(m: ArchMeta, n_layers: int, default_pattern: int) -> list[bool]:
    """Which layers slide: the attention.sliding_window_pattern array as is, else the period n
    (layer il slides iff il % n < n - 1; n = 0: all), llama.cpp's set_swa_pattern."""
    key = f"{m.arch}.attention.sliding_window_pattern"
    value = m.metadata.get(key, default_pattern)
    if isinstance(value, list):
        if len(value) < n_layers or not all(isinstance(v, (bool, int)) for v in value):
            raise ValueError(f"GGUF metadata {key} must hold one bool per layer ({n_layers}), got {value[:8]!r}")
        return [bool(v) for v in value[:n_layers]]
    n = m.count("attention.sliding_window_pattern", default_pattern)
    return [n == 0 or i % n < n - 1 for i in range(n_layers)]


def window_fields(m: ArchMeta, window: int, sliding: list[bool]) -> Fields:
    """sliding_window + layer_types for the layers `sliding` marks."""
    if not any(sliding):
        return dict(sliding_window=None, layer_types=None)
    if window <= 0:
        raise unsupported(f"{m.arch}.attention.sliding_window", window, "sliding layers need a window > 0")
    types = tuple("sliding_attention" if s else "full_attention" for s in sliding)
    return dict(sliding_window=window, layer_types=None if all(sliding) else types)


def moe_fields(m: ArchMeta, d_ff: int, norm_topk: bool, expert_key: str | None) -> Fields:
    """The mixture-of-experts fields (llama.cpp: every layer MoE, softmax -> top-k, renormalised or not)."""
    n_experts, top_k = m.count("expert_count", 0), m.count("expert_used_count", 0)
    if n_experts == 0 or top_k == 0 or top_k > n_experts:
        raise unsupported(f"{m.arch}.expert_count", n_experts, f"with expert_used_count={top_k}: llama.cpp needs "
                          "0 < expert_used_count <= expert_count")
    width = d_ff if expert_key is None else m.count(expert_key, d_ff // top_k)
    return dict(moe_num_experts=n_experts, moe_top_k=top_k, moe_d_ff=width, moe_router="softmax_topk",
                moe_norm_topk_prob=norm_topk, moe_dense_layers=())


# ---- one reader per architecture row (architectures.py): the fields its llama.cpp code adds ----

def read_llama(m: ArchMeta, f: Fields) -> Fields:
    """Llama 1/2/3.x, Mistral; with expert_count > 0 every layer is Mixtral's MoE (expert width
    feed_forward_length, renormalised top-k)."""
    if m.count("expert_count", 0) == 0:
        return {"hf_family": "llama"}
    moe = moe_fields(m, f["d_ff"], True, None)
    if not m.any_layer("ffn_gate_exps"):
        raise ValueError("GGUF llama file with experts but no ffn_gate_exps tensors (ungated experts) is not "
                         "supported by scratchlm")
    return {**moe, "hf_family": "mixtral"}


def read_qwen2(m: ArchMeta, f: Fields) -> Fields:
    return {"hf_family": "qwen2"}


def read_qwen3(m: ArchMeta, f: Fields) -> Fields:
    return {"hf_family": "qwen3", "qk_norm": True, "qk_norm_scope": "head"}


def _gemma(f: Fields, family: str) -> Fields:
    """(1 + w) norms, embeddings * sqrt(D) (llama.cpp: sqrtf(n_embd)), GeGLU with the tanh GELU."""
    return {"hf_family": family, "norm_unit_offset": True, "embedding_multiplier": f["d_model"] ** 0.5,
            "ffn": "glu", "activation": "gelu_tanh"}


def read_gemma(m: ArchMeta, f: Fields) -> Fields:
    return _gemma(f, "gemma")


def read_gemma2(m: ArchMeta, f: Fields) -> Fields:
    """Soft-caps always on (defaults 50 / 30), windows (default 4096 on even layers), the SWA layers' base
    rope.freq_base_swa (default: the global one) with the global scaling; query_pre_attn_scalar is not read:
    the scale is 1/sqrt(head_dim) (1/sqrt(D / heads) with 46 layers)."""
    sliding = swa_layers(m, f["n_layers"], 2)
    base_swa = m.number("rope.freq_base_swa", f["rope_base"])
    local = None
    if any(sliding) and base_swa != f["rope_base"]:
        if f["rope_scaling"] is not None:
            raise unsupported(f"{m.arch}.rope.freq_base_swa", base_swa, "a RoPE base of the sliding layers "
                              "together with RoPE scaling (llama.cpp scales both; scratchlm's local RoPE is unscaled)")
        local = base_swa
    return {**_gemma(f, "gemma2"), "norm_placement": "sandwich", "attn_scale": derived_attn_scale(f, 46),
            "attn_softcap": m.number("attn_logit_softcapping", 50.0),
            "final_softcap": m.number("final_logit_softcapping", 30.0),
            **window_fields(m, m.count("attention.sliding_window", 4096), sliding), "rope_local_base": local}


def read_gemma3(m: ArchMeta, f: Fields) -> Fields:
    """QK-norm, no attention soft-cap, final soft-cap when > 0; windows only with attention.sliding_window > 0
    (pattern default: every 6th layer global), whose layers use rope.freq_base_swa (default 10000) unscaled."""
    window = m.count("attention.sliding_window", 0)
    sliding = swa_layers(m, f["n_layers"], 6) if window > 0 else [False] * f["n_layers"]
    if any(sliding) and m.number("rope.scaling.attn_factor", 1.0) != 1.0:
        raise unsupported(f"{m.arch}.rope.scaling.attn_factor", m.raw("rope.scaling.attn_factor"),
                          "llama.cpp applies it to the sliding layers' unscaled RoPE too")
    final = m.number("final_logit_softcapping", 0.0)
    return {**_gemma(f, "gemma3_text"), "norm_placement": "sandwich", "qk_norm": True, "qk_norm_scope": "head",
            "attn_scale": derived_attn_scale(f, 62), "final_softcap": final or None,
            **window_fields(m, window, sliding),
            "rope_local_base": m.number("rope.freq_base_swa", 10_000.0) if any(sliding) else None}


def read_phi3(m: ArchMeta, f: Fields) -> Fields:
    """Partial rotary (rope.dimension_count), longrope factor tensors; llama.cpp disables phi3's window.
    longrope's long / short choice: llama.cpp takes the long factors when its context n_ctx exceeds L0, scratchlm
    (as transformers) when the forward's longest position does; the two agree whenever llama.cpp runs with
    n_ctx <= L0 or the sequence is already longer than L0 (a context setting of llama.cpp, not of the file)."""
    return {"hf_family": "phi3"}


def read_olmo2(m: ArchMeta, f: Fields) -> Fields:
    """Norms on the attention / FFN outputs only, QK-norm over the whole projections; optional windows
    (OLMo-3; pattern default: every 4th layer global) whose layers use plain RoPE of the global base."""
    window = m.count("attention.sliding_window", 0)
    sliding = swa_layers(m, f["n_layers"], 4) if window > 0 else [False] * f["n_layers"]
    local = f["rope_base"] if any(sliding) and f["rope_scaling"] is not None else None
    return {"hf_family": "olmo2", "norm_placement": "output", "qk_norm": True, "qk_norm_scope": "projection",
            **window_fields(m, window, sliding), "rope_local_base": local}


def read_granite(m: ArchMeta, f: Fields) -> Fields:
    """logit_scale (required), embedding_scale / residual_scale / attention.scale (0 = off);
    rope.scaling.finetuned=false: no RoPE at all."""
    if m.count("expert_count", 0):
        raise unsupported(f"{m.arch}.expert_count", m.raw("expert_count"), "Granite's mixture of experts is not "
                          "implemented")
    if m.has("deepstack_mapping"):
        raise unsupported(f"{m.arch}.deepstack_mapping", m.raw("deepstack_mapping"), "Granite vision's deepstack "
                          "layers are not implemented")
    logit_scale = m.number("logit_scale")
    if logit_scale <= 0:
        raise unsupported(f"{m.arch}.logit_scale", logit_scale, "the logits are divided by it: it must be > 0")
    out = {"hf_family": "granite", "logits_scaling": logit_scale,
           "embedding_multiplier": m.number("embedding_scale", 0.0) or 1.0,
           "residual_multiplier": m.number("residual_scale", 0.0) or 1.0,
           "attn_scale": m.number("attention.scale", 0.0) or None}
    if not m.flag("rope.scaling.finetuned", True):
        out.update(pos_embedding="none", rope_scaling=None, rotary_dim=None)
    return out


def read_smollm3(m: ArchMeta, f: Fields) -> Fields:
    """llama.cpp hard-codes NoPE on every 4th layer (il + 1) % 4 == 0; no metadata says otherwise."""
    return {"hf_family": "smollm3", "nope_layers": tuple(i for i in range(f["n_layers"]) if (i + 1) % 4 == 0)}


def read_qwen2moe(m: ArchMeta, f: Fields) -> Fields:
    """Every layer MoE, top-k weights NOT renormalised, a sigmoid-gated shared expert (width
    expert_shared_feed_forward_length, default feed_forward_length)."""
    moe = moe_fields(m, f["d_ff"], False, "expert_feed_forward_length")
    return {**moe, "hf_family": "qwen2_moe", "d_ff": f["d_ff"] or moe["moe_d_ff"],
            "moe_shared_d_ff": m.count("expert_shared_feed_forward_length", f["d_ff"])}


def read_qwen3moe(m: ArchMeta, f: Fields) -> Fields:
    """Every layer MoE, top-k weights renormalised (whatever the file's expert_weights_norm says), QK-norm."""
    moe = moe_fields(m, f["d_ff"], True, "expert_feed_forward_length")
    return {**moe, "hf_family": "qwen3_moe", "d_ff": f["d_ff"] or moe["moe_d_ff"], "qk_norm": True,
            "qk_norm_scope": "head"}
