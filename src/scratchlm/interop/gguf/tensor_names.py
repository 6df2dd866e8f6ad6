"""GGUF tensor names <-> scratchlm parameter names (HF Llama's naming [firm]), one table for every architecture.

    GGUF (blk.{i}. per layer)       scratchlm (model.layers.{i}. per layer)      notes
    token_embd                      model.embed_tokens
    output_norm                     model.norm
    output                          lm_head                                     absent: the head is tied
    attn_norm                       input_layernorm                             N1, before attention
    attn_q / attn_k / attn_v        self_attn.q_proj / k_proj / v_proj
    attn_qkv                        rows q | k | v of the three above           fused (phi3; any arch may)
    attn_output                     self_attn.o_proj
    attn_q_norm / attn_k_norm       self_attn.q_norm / k_norm
    ffn_norm                        post_attention_layernorm                    N2, before the FFN
    post_attention_norm             attn_output_norm                            N3 (gemma2/3, olmo2)
    post_ffw_norm                   ffn_output_norm                             N4 (gemma2/3, olmo2)
    ffn_gate / ffn_up / ffn_down    mlp.gate_proj / up_proj / down_proj         phi3's ffn_up: rows gate | up
    ffn_gate_inp                    mlp.gate                                    MoE router (E, D)
    ffn_gate_exps / _up_exps        mlp.experts.gate_proj / up_proj             (E, F, D): the same stacking
    ffn_down_exps                   mlp.experts.down_proj                       (E, D, F)
    ffn_gate_inp_shexp              mlp.shared_expert_gate                      (D,) in GGUF, (1, D) ours
    ffn_gate_shexp / _up_ / _down_  mlp.shared_expert.gate_proj / up_proj / down_proj
each with its ".weight" / ".bias" (our stacked experts have no suffix). llama.cpp names the norms by their
place in the block, as ModelConfig's norm_placement does, so no architecture needs a table of its own.
rope_freqs / rope_factors_long / rope_factors_short are no parameters: they describe the RoPE
(rope_tensors.py, ModelConfig.rope_scaling).
"""

from __future__ import annotations

import re

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "attn_output_norm", "post_ffw_norm": "ffn_output_norm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
EXPERT_NAMES = {"ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
                "ffn_down_exps": "mlp.experts.down_proj"}
FUSED_QKV = "attn_qkv"  # rows q | k | v
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_OURS_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+?)(?:\.(weight|bias))?")
_OURS_GLOBAL = {v: k for k, v in GLOBAL_NAMES.items()}
_OURS_TO_GGUF = {**{v: k for k, v in LAYER_NAMES.items()}, **{v: k for k, v in EXPERT_NAMES.items()}}


def split_name(name: str) -> tuple[int | None, str, str]:
    """GGUF name -> (layer or None, kind, "weight" | "bias"): blk.3.attn_q.bias -> (3, "attn_q", "bias")."""
    m = _GGUF_LAYER.fullmatch(name)
    if m:
        return int(m.group(1)), m.group(2), m.group(3)
    base, _, suffix = name.rpartition(".")
    return None, base, suffix


def hf_name(name: str) -> str:
    """GGUF tensor name -> scratchlm's parameter name (a RoPE tensor keeps its own name: it is config, not
    a parameter); ValueError naming a tensor scratchlm has no place for."""
    if name in ROPE_TENSORS:
        return name
    layer, kind, suffix = split_name(name)
    if layer is None and kind in GLOBAL_NAMES and suffix in ("weight", "bias"):
        return f"{GLOBAL_NAMES[kind]}.{suffix}"
    if layer is not None and kind in LAYER_NAMES:
        return f"model.layers.{layer}.{LAYER_NAMES[kind]}.{suffix}"
    if layer is not None and kind in EXPERT_NAMES and suffix == "weight":
        return f"model.layers.{layer}.{EXPERT_NAMES[kind]}"
    if layer is not None and kind == FUSED_QKV:
        return f"model.layers.{layer}.self_attn.qkv_proj.{suffix}"  # split into q/k/v by state_mapping
    raise ValueError(f"GGUF tensor {name!r} has no counterpart in scratchlm's model (known: token_embd, "
                     f"output_norm, output, {', '.join(ROPE_TENSORS)}, blk.N.{{"
                     f"{', '.join([*LAYER_NAMES, *EXPERT_NAMES, FUSED_QKV])}}}); the file holds a feature "
                     "scratchlm does not implement")


def gguf_name(name: str) -> str:
    """scratchlm parameter name -> GGUF tensor name (the inverse of `hf_name`)."""
    base, _, suffix = name.rpartition(".")
    if base in _OURS_GLOBAL:
        return f"{_OURS_GLOBAL[base]}.{suffix}"
    m = _OURS_LAYER.fullmatch(name)
    if m and m.group(2) in _OURS_TO_GGUF:
        return f"blk.{m.group(1)}.{_OURS_TO_GGUF[m.group(2)]}.{m.group(3) or 'weight'}"
    raise ValueError(f"parameter {name!r} has no GGUF tensor name")
