"""The llama.cpp architectures scratchlm reads and writes, as data: one row per `general.architecture`.

A row says what llama.cpp computes for that architecture (src/models/{arch}.cpp of the vendored llama.cpp) in
ModelConfig terms: how its metadata becomes fields (`read`, arch_read.py), which tensors its loader accepts,
how the converter stores q/k rows and norms, and, for export, which ModelConfig features it can carry
(`can`), which values it hard-codes (`fixed`), what else it would run differently (`check`) and its own
keys (`keys`, arch_write.py). Where llama.cpp hard-codes behaviour that transformers makes configurable, the
row follows llama.cpp (gemma2/3: attention scale from head_dim; smollm3: NoPE on every 4th layer;
qwen2moe: top-k weights not renormalised; qwen3moe / Mixtral: renormalised; phi3: no sliding window).

    arch      HF family (export preference)  RoPE pairs    notable
    llama     llama / mistral / mixtral      interleaved   rope_freqs (llama3), o/FFN biases, MoE (Mixtral)
    qwen2     qwen2                          half          heads * head_dim == D
    qwen3     qwen3                          half          QK-norm per head
    gemma     gemma                          half          (1 + w) norms, sqrt(D) embeddings, GeGLU, tied
    gemma2    gemma2                         half          + sandwich norms, soft-caps, windows, tied
    gemma3    gemma3_text                    half          + QK-norm, local RoPE base, final soft-cap
    phi3      phi3                           half          fused qkv / gate|up, partial rotary, longrope
    olmo2     olmo2                          half          output norms, QK-norm over projections, head stored
    granite   granite                        interleaved   four multipliers, o/FFN biases, rope_freqs
    smollm3   smollm3                        interleaved   NoPE layers (every 4th)
    qwen2moe  qwen2_moe                      half          experts + sigmoid-gated shared expert, head stored
    qwen3moe  qwen3_moe                      half          experts, QK-norm
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from scratchlm.config import ModelConfig
from scratchlm.interop.gguf import arch_read as r
from scratchlm.interop.gguf import arch_write as w

Fields = dict[str, Any]

_QKV = frozenset(f"{k}.{s}" for k in ("attn_q", "attn_k", "attn_v", "attn_qkv") for s in ("weight", "bias"))
_ATTN = _QKV | {"attn_norm.weight", "attn_output.weight", "ffn_norm.weight"}
_DENSE = frozenset({"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
_QK_NORM = frozenset({"attn_q_norm.weight", "attn_k_norm.weight"})
_POST = frozenset({"post_attention_norm.weight", "post_ffw_norm.weight"})
_MOE = frozenset({"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
_SHARED = frozenset(f"{k}.weight" for k in ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
_BIASES = frozenset({"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"})
_FREQS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})
_FACTORS = frozenset({"rope_factors_long.weight", "rope_factors_short.weight"})
_PLAIN = frozenset({"linear", "yarn"})


def _none(c: ModelConfig) -> Any:
    return None


def _no_keys(c: ModelConfig) -> Fields:
    return {}


@dataclass(frozen=True)
class GGUFArch:
    """One llama.cpp architecture (module docstring)."""

    name: str
    read: Callable[[r.ArchMeta, Fields], Fields]  # its fields beyond arch_read.common_fields
    tensors: frozenset[str]  # per-layer "kind.suffix" and global names its loader accepts
    can: frozenset[str] = frozenset()  # export: ModelConfig feature fields (family_helpers.FEATURE_DEFAULTS)
    fixed: Callable[[ModelConfig], Fields] = lambda c: {}  # export: the values it hard-codes
    rope_kinds: frozenset[str] = _PLAIN  # export: rope_scaling types it runs
    check: Callable[[ModelConfig], str | None] = _none  # export: anything else it runs differently
    keys: Callable[[ModelConfig], Fields] = _no_keys  # export: its own `{arch}.*` keys
    interleaved_qk: bool = False  # RoPE type NORM: the converter permutes q/k rows to adjacent pairs
    norm_offset: bool = False  # every norm weight stored as 1 + w
    head: str = "optional"  # output.weight: "optional" (absent: tied), "never" (always tied), "required"
    square_attention: bool = False  # q / o projections are D x D: heads * head_dim must equal D
    partial_rotary: bool = False  # rope.dimension_count < head_dim is read
    moe: str = "none"  # "none", "optional" (llama: dense or all-MoE, width feed_forward_length), "required"
    #                    (width expert_feed_forward_length)
    moe_renorm: bool = True  # top-k weights renormalised
    shared_expert: bool = False
    fused: bool = False  # attn_qkv and ffn_up = gate | up written fused (phi3)
    extra: dict[str, str] = field(default_factory=dict)  # tensor -> why it is refused here


ARCHITECTURES: dict[str, GGUFArch] = {a.name: a for a in (
    GGUFArch("llama", r.read_llama, _ATTN | _DENSE | _MOE | _BIASES | _FREQS,
             frozenset({"qkv_bias", "attn_out_bias", "mlp_bias", "rope_scaling", "moe_num_experts"}),
             rope_kinds=_PLAIN | {"llama3", "longrope"}, interleaved_qk=True, moe="optional"),
    GGUFArch("qwen2", r.read_qwen2, _ATTN | _DENSE, frozenset({"qkv_bias", "rope_scaling"}), square_attention=True,
             extra={"output.bias": "an LM-head bias (qwen2's optional output.bias) is not implemented"}),
    GGUFArch("qwen3", r.read_qwen3, _ATTN | _DENSE | _QK_NORM, frozenset({"qkv_bias", "rope_scaling"}),
             w.fixed_qk_head),
    GGUFArch("gemma", r.read_gemma, _ATTN | _DENSE, frozenset({"qkv_bias", "rope_scaling"}), w.gemma_fixed,
             norm_offset=True, head="never"),
    GGUFArch("gemma2", r.read_gemma2, _ATTN | _DENSE | _POST,
             frozenset({"qkv_bias", "rope_scaling", "attn_scale", "attn_softcap", "final_softcap", "sliding_window",
                        "layer_types", "rope_local_base"}),
             w.fixed_gemma2, check=w.check_gemma2, keys=w.keys_gemma2, norm_offset=True, head="never"),
    GGUFArch("gemma3", r.read_gemma3, _ATTN | _DENSE | _POST | _QK_NORM,
             frozenset({"qkv_bias", "rope_scaling", "attn_scale", "final_softcap", "sliding_window", "layer_types",
                        "rope_local_base"}),
             w.fixed_gemma3, check=w.check_gemma3, keys=w.keys_gemma3, norm_offset=True),
    GGUFArch("phi3", r.read_phi3, (_ATTN - {"ffn_gate.weight"}) | {"ffn_up.weight", "ffn_down.weight"} | _FACTORS,
             frozenset({"rope_scaling"}), rope_kinds=_PLAIN | {"longrope"}, square_attention=True,
             partial_rotary=True, fused=True),
    GGUFArch("olmo2", r.read_olmo2, (_ATTN - {"attn_norm.weight", "ffn_norm.weight"}) | _DENSE | _QK_NORM | _POST,
             frozenset({"qkv_bias", "rope_scaling", "sliding_window", "layer_types", "rope_local_base"}),
             w.fixed_olmo2, check=w.check_olmo2, keys=w.keys_olmo2, head="required", square_attention=True),
    GGUFArch("granite", r.read_granite, _ATTN | _DENSE | _BIASES | _FREQS,
             frozenset({"qkv_bias", "attn_out_bias", "mlp_bias", "rope_scaling", "embedding_multiplier",
                        "residual_multiplier", "attn_scale", "logits_scaling", "pos_embedding"}),
             rope_kinds=_PLAIN | {"llama3", "longrope"}, check=w.check_granite, keys=w.keys_granite,
             interleaved_qk=True),
    GGUFArch("smollm3", r.read_smollm3, _ATTN | _DENSE, frozenset({"qkv_bias", "rope_scaling", "nope_layers"}),
             w.fixed_smollm3, interleaved_qk=True),
    GGUFArch("qwen2moe", r.read_qwen2moe, _ATTN | _MOE | _SHARED, frozenset({"qkv_bias", "rope_scaling",
                                                                           "moe_num_experts"}),
             keys=lambda c: w.keys_moe(c, True, True), head="required", square_attention=True, moe="required",
             moe_renorm=False, shared_expert=True),
    GGUFArch("qwen3moe", r.read_qwen3moe, _ATTN | _MOE | _QK_NORM, frozenset({"qkv_bias", "rope_scaling",
                                                                            "moe_num_experts"}),
             w.fixed_qk_head, keys=lambda c: w.keys_moe(c, True, False), moe="required"),
)}
GGUF_ARCHITECTURES = tuple(ARCHITECTURES)
# the GGUF architecture of each HF family (config.hf_family: the export preference)
FROM_HF_FAMILY = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                  "gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3", "olmo2": "olmo2",
                  "granite": "granite", "smollm3": "smollm3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
# export tries these in order when the config's own family does not fit (most specific first)
EXPORT_ORDER = ("qwen2moe", "qwen3moe", "gemma3", "gemma2", "gemma", "olmo2", "smollm3", "phi3", "qwen3", "llama",
                "granite", "qwen2")
