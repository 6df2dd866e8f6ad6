"""GGUF tensor names <-> scratchlm/HF parameter names, and llama.cpp's Q/K row order for the llama architecture.

    GGUF                         scratchlm / HF Llama
    token_embd                   model.embed_tokens
    output_norm                  model.norm
    output                       lm_head                       (absent when the head is tied)
    blk.{i}.attn_norm            model.layers.{i}.input_layernorm
    blk.{i}.attn_q / _k / _v     model.layers.{i}.self_attn.q_proj / k_proj / v_proj
    blk.{i}.attn_output          model.layers.{i}.self_attn.o_proj
    blk.{i}.attn_q_norm / _k_norm model.layers.{i}.self_attn.q_norm / k_norm   (qwen3)
    blk.{i}.ffn_norm             model.layers.{i}.post_attention_layernorm
    blk.{i}.ffn_gate / _up / _down model.layers.{i}.mlp.gate_proj / up_proj / down_proj
each with its ".weight" / ".bias" suffix.

Q/K rows: llama.cpp's converter rewrites the q_proj/k_proj rows (and biases) of the *llama* architecture so
that each head's rotary pairs are adjacent, (x[2i], x[2i+1]) -- the "interleaved" RoPE of Meta's original
code -- where HF pairs (x[i], x[i + Hd/2]) ("half"). Per head, GGUF row 2i + s holds HF row i + s*Hd/2,
i.e. GGUF = HF[perm] with perm = half_to_interleaved. qwen2/qwen3 files keep HF's order.
"""

from __future__ import annotations

import re

import torch

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.state_dict import permute_rope_heads

GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_HF_GLOBAL = {v: k for k, v in GLOBAL_NAMES.items()}
_HF_LAYER = {v: k for k, v in LAYER_NAMES.items()}
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
# architectures whose GGUF q/k rows are in llama.cpp's interleaved order
PERMUTED_QK_ARCHS = ("llama",)


def hf_name(name: str) -> str:
    """GGUF tensor name -> HF parameter name; ValueError naming a tensor scratchlm has no place for."""
    base, _, kind = name.rpartition(".")
    if base in GLOBAL_NAMES and kind in ("weight", "bias"):
        return f"{GLOBAL_NAMES[base]}.{kind}"
    m = _GGUF_LAYER.fullmatch(name)
    if m and m.group(2) in LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    raise ValueError(f"GGUF tensor {name!r} has no counterpart in scratchlm's model (known: token_embd, "
                     f"output_norm, output, blk.N.{{{', '.join(LAYER_NAMES)}}}); the file holds a feature "
                     "scratchlm does not implement")


def gguf_name(name: str) -> str:
    """HF parameter name -> GGUF tensor name (the inverse of `hf_name`)."""
    base, _, kind = name.rpartition(".")
    if base in _HF_GLOBAL:
        return f"{_HF_GLOBAL[base]}.{kind}"
    m = _HF_LAYER_RE.fullmatch(name)
    if m and m.group(2) in _HF_LAYER:
        return f"blk.{m.group(1)}.{_HF_LAYER[m.group(2)]}.{m.group(3)}"
    raise ValueError(f"parameter {name!r} has no GGUF tensor name")


def qk_rows_from_gguf(state: dict[str, torch.Tensor], config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Undo llama.cpp's q/k row order (llama only): GGUF-order rows -> HF's "half" order.

    Works on any row-major tensors keyed by HF name: float weights and raw ggml rows alike.
    """
    if arch not in PERMUTED_QK_ARCHS:
        return state
    return permute_rope_heads(state, config, to_half=True)


def qk_rows_to_gguf(state: dict[str, torch.Tensor], config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """HF "half"-order q/k rows -> llama.cpp's order (llama only); the inverse of `qk_rows_from_gguf`."""
    if arch not in PERMUTED_QK_ARCHS:
        return state
    return permute_rope_heads(state, config, to_half=False)
