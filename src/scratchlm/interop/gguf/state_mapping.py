"""GGUF tensors <-> a scratchlm state dict: the names of tensor_names.py plus what llama.cpp's converter does to
the values (conversion/*.py), undone on import and redone on export.

    q/k rows      NORM-RoPE archs (llama, granite, smollm3): each head's rows in adjacent-pair order
                  ("interleaved"), GGUF row 2i + s = HF row i + s Hd/2 (LlamaModel.permute). A model with
                  rope_style "interleaved" uses them as they are; a "half" model gets them permuted.
    norms         gemma, gemma2, gemma3: every norm weight stored as 1 + w (ours: w, norm_unit_offset)
    fused         attn_qkv = rows q | k | v (any arch may; phi3's converter always fuses); phi3's ffn_up = rows
                  gate | up (2F rows)
    head          no output.weight = tied (gemma/gemma2 never store one; olmo2 / qwen2moe always do)
    biases        q/k/v biases one layer lacks (llama.cpp: a null bias) become zeros
    shared gate   ffn_gate_inp_shexp (D,) <-> mlp.shared_expert_gate.weight (1, D)
Every step works on raw ggml rows (uint8 (rows, row_bytes), a matrix kept in its blocks) as on float values:
rows of a ggml matrix are independent runs of blocks, so splitting and permuting rows is exact. Norm weights
and biases are always floats.
"""

from __future__ import annotations

import torch

from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.architectures import GGUFArch
from scratchlm.interop.gguf.tensor_names import FUSED_QKV, ROPE_TENSORS, gguf_name, hf_name, split_name
from scratchlm.interop.hf.state_dict import permute_rope_heads

Tensor = torch.Tensor
StateDict = dict[str, Tensor]
QKV = ("q_proj", "k_proj", "v_proj")


def _qkv_rows(c: ModelConfig) -> list[int]:
    return [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim]


def _split(t: Tensor, name: str, sizes: list[int]) -> tuple[Tensor, ...]:
    if t.shape[0] != sum(sizes):
        raise ValueError(f"GGUF tensor {name} has {t.shape[0]} rows; the metadata implies "
                         f"{' + '.join(map(str, sizes))}")
    return t.split(sizes, 0)


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _rope(c: ModelConfig) -> bool:
    return c.pos_embedding == "rope"


def state_from_gguf(tensors: dict[str, Tensor], config: ModelConfig, arch: GGUFArch) -> StateDict:
    """GGUF name -> values (float, or raw rows for matrices) -> scratchlm's state (our names, our row order)."""
    out: StateDict = {}
    for name, t in tensors.items():
        if name in ROPE_TENSORS:
            continue  # read into config.rope_scaling
        layer, kind, suffix = split_name(name)
        prefix = f"model.layers.{layer}."
        if kind == FUSED_QKV:
            for p, part in zip(QKV, _split(t, name, _qkv_rows(config))):
                out[f"{prefix}self_attn.{p}.{suffix}"] = part
        elif kind == "ffn_up" and arch.fused:
            gate, up = _split(t, name, [config.d_ff, config.d_ff])
            out[f"{prefix}mlp.gate_proj.{suffix}"], out[f"{prefix}mlp.up_proj.{suffix}"] = gate, up
        elif kind == "ffn_gate_inp_shexp":
            out[hf_name(name)] = t.reshape(1, -1) if t.dim() == 1 else t
        else:
            out[hf_name(name)] = t
    if arch.norm_offset:
        out = {k: (v - 1.0 if _is_norm(k) else v) for k, v in out.items()}
    if arch.interleaved_qk and _rope(config) and config.rope_style == "half":
        out = permute_rope_heads(out, config, to_half=True)
    _zero_biases(out, config)
    if config.tie_embeddings and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _zero_biases(state: StateDict, c: ModelConfig) -> None:
    """The biases a config has and a layer's tensors lack: zeros (in place)."""
    wanted = [f"self_attn.{p}" for p in QKV] if c.qkv_bias else []
    wanted += ["self_attn.o_proj"] if c.attn_out_bias else []
    for i in range(c.n_layers):
        mlp = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] if c.mlp_bias and not c.is_moe_layer(i) else []
        rows = {"self_attn.q_proj": c.n_heads * c.head_dim, "self_attn.k_proj": c.n_kv_heads * c.head_dim,
                "self_attn.v_proj": c.n_kv_heads * c.head_dim, "self_attn.o_proj": c.d_model,
                "mlp.gate_proj": c.d_ff, "mlp.up_proj": c.d_ff, "mlp.down_proj": c.d_model}
        for module in wanted + mlp:
            state.setdefault(f"model.layers.{i}.{module}.bias", torch.zeros(rows[module]))


def state_to_gguf(state: StateDict, config: ModelConfig, arch: GGUFArch) -> dict[str, Tensor]:
    """scratchlm's state -> {GGUF name: float tensor} as llama.cpp's converter writes it (module docstring)."""
    s = {k: v.detach().to("cpu") for k, v in state.items()}
    embed = s["model.embed_tokens.weight"]
    if config.tie_embeddings:
        s.pop("lm_head.weight", None)
        if arch.head == "required":
            s["lm_head.weight"] = embed.clone()
    if _rope(config) and config.rope_style == "interleaved":
        s = permute_rope_heads(s, config, to_half=True)
    if arch.interleaved_qk and _rope(config):
        s = permute_rope_heads(s, config, to_half=False)
    if arch.norm_offset:
        s = {k: (v + 1.0 if _is_norm(k) else v) for k, v in s.items()}
    out: dict[str, Tensor] = {}
    for i in range(config.n_layers) if arch.fused else ():
        p = f"model.layers.{i}."
        for suffix in ("weight", "bias"):
            parts = [s.pop(f"{p}self_attn.{q}.{suffix}", None) for q in QKV]
            if parts[0] is not None:
                out[f"blk.{i}.{FUSED_QKV}.{suffix}"] = torch.cat(parts, 0)
        out[f"blk.{i}.ffn_up.weight"] = torch.cat([s.pop(f"{p}mlp.gate_proj.weight"), s.pop(f"{p}mlp.up_proj.weight")])
    for name, value in s.items():
        if name.endswith("shared_expert_gate.weight"):
            value = value.reshape(-1)
        out[gguf_name(name)] = value.contiguous()
    return out
