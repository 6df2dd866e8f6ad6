"""Write a TransformerLM (+ its tokenizer and chat template) as a GGUF file that llama.cpp reads.

    save_gguf(model, "out.gguf", type_name="Q8_0", tokenizer=tok, chat_template=template, stop_token_ids=[2])

The inverse of gguf_load, with the same tables: ModelConfig -> `{arch}.*` metadata (gguf_config's
table read backwards), HF parameter names -> GGUF names (gguf_names), llama's q/k rows put into
llama.cpp's interleaved order, 2-D weights quantized to F32 / F16 / BF16 / Q8_0 (quant.quantize; a
matrix whose rows do not split into Q8_0 blocks of 32 is written as F16, as llama.cpp's converter does),
1-D weights (norms, biases) always F32, and the tokenizer as `tokenizer.ggml.*` (gguf_tokenizer). The
container itself is written by the `gguf` package's GGUFWriter, into a temp file renamed into place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from scratchlm.interop.gguf.metadata_config import GGUF_ARCHITECTURES
from scratchlm.interop.gguf.tensor_names import gguf_name, qk_rows_to_gguf
from scratchlm.interop.gguf.tokenizer_metadata import gguf_tokenizer_metadata
from scratchlm.interop.hf.config_json import export_family
from scratchlm.interop.hf.state_dict import state_to_hf
from scratchlm.model import TransformerLM
from scratchlm.quant.quantize import quantize
from scratchlm.quant.ggml_types import ggml_type

EXPORT_TYPES = ("F32", "F16", "BF16", "Q8_0")
FILE_TYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}  # general.file_type (llama_ftype)
_U32, _F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def _model_metadata(model: TransformerLM, arch: str, name: str, type_name: str) -> list[tuple[str, Any, Any]]:
    c = model.config
    u32 = [("block_count", c.n_layers), ("context_length", c.max_seq_len), ("embedding_length", c.d_model),
           ("feed_forward_length", c.d_ff), ("attention.head_count", c.n_heads),
           ("attention.head_count_kv", c.n_kv_heads), ("attention.key_length", c.head_dim),
           ("attention.value_length", c.head_dim), ("rope.dimension_count", c.head_dim),
           ("vocab_size", c.vocab_size)]
    f32 = [("attention.layer_norm_rms_epsilon", c.norm_eps), ("rope.freq_base", c.rope_base)]
    return ([("general.architecture", arch, gguf.GGUFValueType.STRING), ("general.name", name, gguf.GGUFValueType.STRING),
             ("general.file_type", FILE_TYPES[type_name], _U32), ("general.quantization_version", 2, _U32)]
            + [(f"{arch}.{k}", int(v), _U32) for k, v in u32] + [(f"{arch}.{k}", float(v), _F32) for k, v in f32])


def _tensor(name: str, value: torch.Tensor, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(bytes or values as numpy, ggml type) for one tensor; matrices in `type_name`, vectors in F32."""
    if value.dim() != 2:
        return value.detach().to(torch.float32).contiguous().numpy(), gguf.GGMLQuantizationType.F32
    kind = type_name
    if value.shape[1] % ggml_type(kind).block_size:
        kind = "F16"  # llama.cpp's fallback for rows that do not split into blocks
    return quantize(value, kind).numpy(), gguf.GGMLQuantizationType[kind]


def _check_exportable(model: TransformerLM, type_name: str) -> str:
    if type_name not in EXPORT_TYPES:
        raise ValueError(f"GGUF export type {type_name!r} is not supported; choose one of {', '.join(EXPORT_TYPES)}")
    arch = export_family(model.config)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF export supports the {', '.join(GGUF_ARCHITECTURES)} architectures; this model "
                         f"exports as {arch!r} (e.g. learned positions and LayerNorm are GPT-2's)")
    c = model.config
    for name, value in (("rope_scaling", c.rope_scaling), ("sliding_window", c.sliding_window)):
        if value is not None:  # llama.cpp would run the model without it: a silently different model
            raise ValueError(f"GGUF export does not write {name}={value!r}; export this model with "
                             "save_pretrained (Hugging Face format) instead")
    return arch


def _write_kv(writer: gguf.GGUFWriter, key: str, value: Any, vtype: Any) -> None:
    if isinstance(value, list):
        writer.add_array(key, value)
    else:
        writer.add_key_value(key, value, vtype)


def save_gguf(model: TransformerLM, path: str | Path, *, type_name: str = "F16", tokenizer: Any = None,
              chat_template: str | None = None, bos_token_id: int | None = None,
              stop_token_ids: list[int] | tuple[int, ...] = (), name: str | None = None) -> Path:
    """Write `model` (and its tokenizer) to `path` as GGUF; see the module docstring."""
    arch = _check_exportable(model, type_name)
    path = Path(path)
    state = qk_rows_to_gguf(state_to_hf(model.state_dict(), model.config, arch), model.config, arch)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        for key, value, vtype in _model_metadata(model, arch, name or path.stem, type_name):
            if key != "general.architecture":  # GGUFWriter adds it
                _write_kv(writer, key, value, vtype)
        if tokenizer is not None:
            meta = gguf_tokenizer_metadata(tokenizer.to_hf_dict(), model.config.vocab_size, chat_template,
                                           bos_token_id, list(stop_token_ids))
            for key, (value, vtype) in meta.items():
                _write_kv(writer, key, value, vtype)
        for hf, value in state.items():
            data, qtype = _tensor(hf, value, type_name)
            writer.add_tensor(gguf_name(hf), data, raw_dtype=qtype)
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
