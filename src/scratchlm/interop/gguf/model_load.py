"""Load a GGUF file (llama / qwen2 / qwen3) as a TransformerLM, optionally keeping its ggml blocks.

    model = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")             # fp32 weights, HF "half" RoPE order
    model = load_gguf(path, dtype=torch.bfloat16, rope_style="interleaved")   # keep llama.cpp's q/k order
    model.quantized_weights["model.layers.0.self_attn.q_proj.weight"]        # GGMLBlocks (Q4_1), same rows

Steps: read the container (gguf_file) -> HF config dict from the metadata (gguf_config) -> ModelConfig
(hf_config.config_from_hf, which refuses what scratchlm does not implement) -> tensors renamed to HF names
(gguf_names) -> every tensor dequantized to float32 (quant.dequantize, bit-exact with ggml) -> llama's q/k
rows put back in HF order -> the HF state-dict mapping shared with `from_pretrained` (tied head; rows
permuted again when rope_style="interleaved" is asked for) -> the model, cast to `dtype`.

`model.quantized_weights` maps every 2-D weight (HF name; the tied head under both names) to the file's
own blocks, rows in the same order as the model's weights, so a decode kernel computes exactly the
quantized model. They describe the weights as loaded: fine-tuning changes the float weights only, so
training code drops them (`keep_quantized=False`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from scratchlm.interop.gguf.metadata_config import gguf_architecture, hf_config_from_gguf
from scratchlm.interop.gguf.reader import GGUFContents, read_gguf
from scratchlm.interop.gguf.tensor_names import hf_name, qk_rows_from_gguf
from scratchlm.interop.hf.config_json import config_from_hf
from scratchlm.interop.hf.state_dict import state_from_hf
from scratchlm.interop.model_build import build_with_weights
from scratchlm.config import ModelConfig
from scratchlm.model import TransformerLM
from scratchlm.quant.blocks import GGMLBlocks


def gguf_model_config(contents: GGUFContents, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a GGUF file (overrides such as attn_impl or rope_style applied last)."""
    hf = hf_config_from_gguf(contents.metadata, set(contents.tensors))
    return config_from_hf(hf, **overrides)


def _scratchlm_order(tensors: dict[str, torch.Tensor], config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """GGUF-order tensors keyed by HF name -> scratchlm's state (same mapping for floats and raw rows)."""
    return state_from_hf(qk_rows_from_gguf(tensors, config, arch), config, arch)


def _quantized_weights(contents: GGUFContents, config: ModelConfig, arch: str,
                       device: torch.device) -> dict[str, GGMLBlocks]:
    matrices = {hf_name(n): t for n, t in contents.tensors.items() if len(t.shape) == 2}
    rows = _scratchlm_order({k: t.data for k, t in matrices.items()}, config, arch)
    types = {k: t.type_name for k, t in matrices.items()}
    types.setdefault("lm_head.weight", types["model.embed_tokens.weight"])  # tied head: the embedding's blocks
    shapes = {k: t.shape for k, t in matrices.items()}
    shapes.setdefault("lm_head.weight", shapes["model.embed_tokens.weight"])
    return {k: GGMLBlocks(types[k], r.to(device), (shapes[k][0], shapes[k][1])) for k, r in rows.items()}


def load_gguf(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
              keep_quantized: bool = True, progress: bool = False, contents: GGUFContents | None = None,
              **config_overrides: Any) -> TransformerLM:
    """TransformerLM (eval mode) with the dequantized weights of a GGUF file; see the module docstring.

    contents: an already parsed file (read_gguf) to avoid reading it twice.
    """
    contents = contents or read_gguf(path)
    arch = gguf_architecture(contents.metadata)
    config = gguf_model_config(contents, **config_overrides)
    items = list(contents.tensors.items())
    values = {hf_name(name): t.dequantize()
              for name, t in tqdm(items, desc="dequantize", unit="tensor", disable=not progress)}
    model = build_with_weights(config, _scratchlm_order(values, config, arch), Path(path))
    model = model.to(device=device, dtype=dtype).eval()
    if keep_quantized:
        model.quantized_weights = _quantized_weights(contents, config, arch, torch.device(device))
    return model
