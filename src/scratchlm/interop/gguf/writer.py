"""Write a TransformerLM (+ its tokenizer and chat template) as a GGUF file that llama.cpp runs as scratchlm does.

    save_gguf(model, "out.gguf", type_name="Q8_0", tokenizer=tok, chat_template=template, stop_token_ids=[2])

The inverse of model_load, with the same tables and llama.cpp's converter conventions (convert_hf_to_gguf.py,
conversion/*.py): the architecture is the row of architectures.py that computes this config exactly
(export_checks.py; a config llama.cpp would run differently is refused, naming why, for every architecture);
metadata `{arch}.*` with the value types llama.cpp checks (counts UINT32, floats FLOAT32; rope.freq_base always,
the architecture's own keys from arch_write.py, sliding-window patterns as bool arrays); tensors renamed and
transformed by state_mapping.py (q/k rows of llama/granite/smollm3 in llama.cpp's adjacent-pair order, Gemma's
1 + w norms, phi3's fused qkv and gate|up, the head written or not as the architecture demands) plus the RoPE
factor tables of rope_tensors.py; matrices and expert tensors in F32 / F16 / BF16 / Q8_0 (quant.quantize: a
tensor whose rows do not split into blocks of 32 is written as F16, as the converter falls back), and F32 for
what the converter keeps in F32: vectors, norms, biases, routers (ffn_gate_inp, ffn_gate_inp_shexp), RoPE
factors. K-quants and IQ types: run llama.cpp's quantizer on an F32/F16 file (llama_model_quantize /
llama-quantize). The tokenizer is written as `tokenizer.ggml.*` (tokenizer_metadata); the container by the
`gguf` package's GGUFWriter, into a temp file renamed into place.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from scratchlm.nn.block_state import dense_state_dict
from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.arch_write import keys_moe, rope_keys
from scratchlm.interop.gguf.architectures import GGUFArch
from scratchlm.interop.gguf.export_checks import export_architecture
from scratchlm.interop.gguf.rope_tensors import rope_tensors_for
from scratchlm.interop.gguf.state_mapping import state_to_gguf
from scratchlm.interop.gguf.tensor_names import ROPE_TENSORS, split_name
from scratchlm.interop.gguf.tokenizer_metadata import gguf_tokenizer_metadata
from scratchlm.model import TransformerLM
from scratchlm.quant.ggml_types import ggml_type
from scratchlm.quant.quantize import quantize

EXPORT_TYPES = ("F32", "F16", "BF16", "Q8_0")
FILE_TYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}  # general.file_type (llama_ftype)
F32_KINDS = ("ffn_gate_inp", "ffn_gate_inp_shexp")  # routers stay F32 (the converter forces them)
_VALUE_TYPES = ((bool, gguf.GGUFValueType.BOOL), (int, gguf.GGUFValueType.UINT32),
                (float, gguf.GGUFValueType.FLOAT32), (str, gguf.GGUFValueType.STRING))


def _model_keys(c: ModelConfig, arch: GGUFArch) -> dict[str, Any]:
    """Every `{arch}.*` key (without the prefix), typed by its Python value (arch_write.py)."""
    expert_width = arch.moe == "required"
    ff = c.moe_d_ff if c.moe_num_experts and not expert_width else c.d_ff  # llama (Mixtral): experts' width
    keys = {"block_count": c.n_layers, "context_length": c.max_seq_len, "embedding_length": c.d_model,
            "feed_forward_length": ff, "attention.head_count": c.n_heads, "attention.head_count_kv": c.n_kv_heads,
            "attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
            "rope.dimension_count": c.rope_dim if c.pos_embedding == "rope" else c.head_dim,
            "vocab_size": c.vocab_size, "attention.layer_norm_rms_epsilon": float(c.norm_eps),
            "rope.freq_base": float(c.rope_base)}
    freqs = "rope_freqs.weight" in arch.tensors
    return {**{k: int(v) if isinstance(v, int) else v for k, v in keys.items()}, **rope_keys(c, arch.name, freqs),
            **keys_moe(c, expert_width, arch.shared_expert), **arch.keys(c)}


def _stays_f32(name: str, value: torch.Tensor) -> bool:
    kind = split_name(name)[1]
    return (value.dim() < 2 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or kind in F32_KINDS or name in ROPE_TENSORS)


def _tensor(name: str, value: torch.Tensor, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(bytes or values as numpy, ggml type) for one tensor (module docstring)."""
    if _stays_f32(name, value):
        return value.detach().to(torch.float32).contiguous().numpy(), gguf.GGMLQuantizationType.F32
    kind = type_name if value.shape[-1] % ggml_type(type_name).block_size == 0 else "F16"
    rows = quantize(value.reshape(-1, value.shape[-1]), kind)  # (rows, row_bytes): 3-D experts stacked by rows
    return rows.reshape(*value.shape[:-1], rows.shape[-1]).numpy(), gguf.GGMLQuantizationType[kind]


def _write_kv(writer: gguf.GGUFWriter, key: str, value: Any, vtype: Any = None) -> None:
    if isinstance(value, list):
        writer.add_array(key, value)
        return
    if vtype is None:
        vtype = next(t for cls, t in _VALUE_TYPES if isinstance(value, cls))
    writer.add_key_value(key, value, vtype)


def _check_type(type_name: str) -> None:
    if type_name not in EXPORT_TYPES:
        raise ValueError(f"GGUF export type {type_name!r} is not supported; choose one of {', '.join(EXPORT_TYPES)} "
                         "(K-quants and IQ types: llama.cpp's quantizer on the F32/F16 file)")


def gguf_tensors(model: TransformerLM, arch: GGUFArch) -> dict[str, torch.Tensor]:
    """The float tensors a GGUF file of `model` holds, by GGUF name (before quantization)."""
    c = model.config
    tensors = state_to_gguf(dense_state_dict(model), c, arch)
    zero_gates = [n for n, t in tensors.items() if n.endswith("ffn_gate_inp_shexp.weight") and not t.any()]
    if zero_gates:  # llama.cpp's shared-expert gate is silu(g) / g: 0 / 0 where scratchlm has sigmoid(0) = 0.5
        warnings.warn(f"GGUF export: {zero_gates[0]} is all zeros; llama.cpp computes NaN for its shared-expert gate "
                      "(silu(0) / 0) where scratchlm computes 0.5", stacklevel=3)
    if c.pos_embedding == "rope":
        tensors.update(rope_tensors_for(c.rope_scaling, c.rope_base, c.rope_dim, c.max_seq_len,
                                        "rope_freqs.weight" in arch.tensors))
    return tensors


def save_gguf(model: TransformerLM, path: str | Path, *, type_name: str = "F16", tokenizer: Any = None,
              chat_template: str | None = None, bos_token_id: int | None = None,
              stop_token_ids: list[int] | tuple[int, ...] = (), name: str | None = None) -> Path:
    """Write `model` (and its tokenizer) to `path` as GGUF; see the module docstring."""
    _check_type(type_name)
    arch = export_architecture(model.config)
    tensors = gguf_tensors(model, arch)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch.name)
    try:
        _write_kv(writer, "general.name", name or path.stem)
        _write_kv(writer, "general.file_type", FILE_TYPES[type_name])
        _write_kv(writer, "general.quantization_version", 2)
        for key, value in _model_keys(model.config, arch).items():
            _write_kv(writer, f"{arch.name}.{key}", value)
        if tokenizer is not None:
            meta = gguf_tokenizer_metadata(tokenizer.to_hf_dict(), model.config.vocab_size, chat_template,
                                           bos_token_id, list(stop_token_ids))
            for key, (value, vtype) in meta.items():
                _write_kv(writer, key, value, vtype)
        for gguf_name, value in tensors.items():
            data, qtype = _tensor(gguf_name, value, type_name)
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path
