"""GGUF metadata + tensor list -> ModelConfig fields, as llama.cpp computes the model (architectures.py rows).

    GGUF key ({arch}.)                 ModelConfig              llama.cpp default / notes
    block_count                        n_layers                 required
    context_length                     max_seq_len              required
    embedding_length                   d_model                  required
    feed_forward_length                d_ff                     (Mixtral: the expert width)
    attention.head_count(_kv)          n_heads / n_kv_heads     kv default: head_count; per-layer arrays only
                                                                when every layer has the same value
    attention.key_length               head_dim                 embedding_length / head_count (= value_length)
    attention.layer_norm_rms_epsilon   norm_eps                 required
    rope.freq_base                     rope_base                10000
    rope.dimension_count               rotary_dim               = head_dim; smaller only for phi3
    rope.scaling.* + rope_freqs /      rope_scaling             none / linear / yarn / longrope; the factor
      rope_factors_* tensors                                    tables: rope_tensors.py
    expert_count, expert_used_count    moe_num_experts / top_k  + the architecture's routing (architectures.py)
    token_embd rows                    vocab_size               (llama.cpp: the tokenizer's length, which must
                                                                equal them)
plus each architecture's own keys (arch_read.py). Tensors fill in the rest: no output.weight -> a tied head;
any q/k/v (o, FFN) bias tensor -> qkv_bias (attn_out_bias, mlp_bias). A tensor the architecture's llama.cpp
loader does not accept, and every key value scratchlm cannot compute, is refused by name: never a different model.
"""

from __future__ import annotations

from typing import Any

import torch

from scratchlm.interop.gguf.arch_read import ArchMeta, common_fields, unsupported
from scratchlm.interop.gguf.architectures import ARCHITECTURES, GGUF_ARCHITECTURES, GGUFArch
from scratchlm.interop.gguf.tensor_names import ROPE_TENSORS, split_name

__all__ = ["GGUF_ARCHITECTURES", "check_tensor_set", "config_fields", "gguf_arch", "gguf_architecture"]
_GLOBAL = {"token_embd.weight", "output_norm.weight", "output.weight"}


def gguf_architecture(metadata: dict[str, Any]) -> str:
    """general.architecture, checked against the architectures scratchlm loads."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise unsupported("general.architecture", arch, f"supported architectures: {', '.join(GGUF_ARCHITECTURES)}")
    return arch


def gguf_arch(metadata: dict[str, Any]) -> GGUFArch:
    """The architecture row of a file."""
    return ARCHITECTURES[gguf_architecture(metadata)]


def check_tensor_set(arch: GGUFArch, names: list[str] | set[str], n_layers: int) -> None:
    """Every tensor is one the architecture's llama.cpp loader accepts and scratchlm implements (and the head,
    where llama.cpp requires it, is there)."""
    if arch.head == "required" and "output.weight" not in names:
        raise ValueError(f"GGUF file of architecture {arch.name!r} has no output.weight; llama.cpp's {arch.name} "
                         "requires the head tensor (it refuses the file: 'tensor output.weight not found')")
    for name in names:
        layer, kind, suffix = split_name(name)
        key = f"{kind}.{suffix}"
        if layer is None:
            ok = (name in _GLOBAL and not (name == "output.weight" and arch.head == "never")) or name in (
                arch.tensors & set(ROPE_TENSORS))
        else:
            ok = key in arch.tensors and layer < n_layers
        if not ok:
            why = arch.extra.get(name) or arch.extra.get(key) or (
                f"llama.cpp's {arch.name} architecture has no such tensor (its loader refuses the file: "
                "'wrong number of tensors') or it is a feature scratchlm does not implement")
            raise ValueError(f"GGUF tensor {name} is not supported by scratchlm for architecture {arch.name!r}: {why}")


def config_fields(metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                  rope_tensors: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """ModelConfig keyword arguments of a GGUF file: metadata, tensor shapes (torch order) and the values of its
    RoPE factor tensors (rope_freqs / rope_factors_*, which describe the RoPE rather than hold weights)."""
    arch = gguf_arch(metadata)
    meta = ArchMeta(arch.name, metadata, shapes, rope_tensors)
    check_tensor_set(arch, list(shapes), meta.n_layers())
    fields = common_fields(meta, arch.partial_rotary)
    fields.update(arch.read(meta, fields))
    if arch.square_attention and fields["n_heads"] * fields["head_dim"] != fields["d_model"]:
        raise unsupported(f"{arch.name}.attention.key_length", fields["head_dim"], f"llama.cpp's {arch.name} needs "
                          f"head_count * key_length = embedding_length ({fields['d_model']})")
    return fields
