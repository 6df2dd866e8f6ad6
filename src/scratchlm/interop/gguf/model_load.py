"""Load a GGUF file (llama / qwen2 / qwen3) as a TransformerLM: on the file's own blocks, or dequantized.

    model = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")              # the blocks are the weights (default)
    model = load_gguf(path, dtype=torch.float32)                      # a dense fp32 copy (training, export)
    model = load_gguf(path, dtype=torch.bfloat16, rope_style="interleaved")   # keep llama.cpp's q/k order

Steps: read the container (reader) -> HF config dict from the metadata (metadata_config) -> ModelConfig
(hf/config_json.config_from_hf, which refuses what scratchlm does not implement) -> tensors renamed to HF
names (tensor_names) -> llama's q/k rows put back in HF order (or, with rope_style="interleaved", left
in llama.cpp's) -> the HF state-dict mapping shared with `load_hf_dir` (tied head, fused splits) -> the
model. Every step works on raw ggml rows as well as on floats: rows of a ggml matrix are independent.

dtype=None (the default): every matrix stays in its ggml blocks (nn/block_linear.py, block_embedding.py),
norms and biases become fp32; for the llama architecture the RoPE style defaults to "interleaved" (the
same function: tests/interop/test_rope_interleaved.py) so q/k rows need no permuted copy. Memory is the
file plus small tensors. dtype=torch.float32 / bfloat16: every tensor dequantized (bit-exact with ggml)
and cast; `keep_quantized` then also attaches the file's blocks as `model.quantized_weights` (HF name ->
GGMLBlocks, the tied head under both names, rows in the model's order) for decode="fast-gguf".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from scratchlm.interop.gguf.metadata_config import gguf_architecture, hf_config_from_gguf
from scratchlm.interop.gguf.reader import GGUFContents, read_gguf
from scratchlm.interop.gguf.tensor_names import PERMUTED_QK_ARCHS, hf_name, qk_rows_from_gguf
from scratchlm.interop.hf.config_json import config_from_hf
from scratchlm.interop.hf.state_dict import state_from_hf
from scratchlm.interop.model_build import build_with_blocks, build_with_weights
from scratchlm.config import ModelConfig
from scratchlm.model import TransformerLM
from scratchlm.quant.blocks import GGMLBlocks


def gguf_model_config(contents: GGUFContents, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a GGUF file (overrides such as attn_impl or rope_style applied last)."""
    hf = hf_config_from_gguf(contents.metadata, set(contents.tensors))
    return config_from_hf(hf, **overrides)


def _scratchlm_order(tensors: dict[str, torch.Tensor], config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """GGUF-order tensors keyed by HF name -> scratchlm's state (same mapping for floats and raw rows).

    llama's q/k rows are in llama.cpp's interleaved order: for an interleaved-RoPE model they stay so
    (no copy); for a "half" model they are permuted to HF's order."""
    if arch in PERMUTED_QK_ARCHS and config.pos_embedding == "rope" and config.rope_style == "interleaved":
        return state_from_hf(tensors, config.replace(rope_style="half"), arch)  # rows already interleaved
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


def _block_model(path: Path, contents: GGUFContents, config: ModelConfig, arch: str) -> TransformerLM:
    """The model on the file's own blocks: matrices as GGMLBlocks over the mapped file (no copy), the rest fp32."""
    raw = {hf_name(n): (t.view() if len(t.shape) >= 2 else t.dequantize()) for n, t in contents.tensors.items()}
    types = {hf_name(n): t.type_name for n, t in contents.tensors.items() if len(t.shape) >= 2}
    types.setdefault("lm_head.weight", types.get("model.embed_tokens.weight"))  # a tied head reads the embedding
    return build_with_blocks(config, _scratchlm_order(raw, config, arch), types, path)


def load_gguf(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              keep_quantized: bool = True, progress: bool = False, contents: GGUFContents | None = None,
              **config_overrides: Any) -> TransformerLM:
    """TransformerLM (eval mode) of a GGUF file, on its own blocks (dtype=None) or dequantized to `dtype`;
    see the module docstring. contents: an already parsed file (read_gguf) to avoid reading it twice.
    """
    contents = contents or read_gguf(path)
    arch = gguf_architecture(contents.metadata)
    if dtype is None and arch in PERMUTED_QK_ARCHS:
        config_overrides.setdefault("rope_style", "interleaved")  # llama.cpp's q/k row order, used as is
    config = gguf_model_config(contents, **config_overrides)
    contents.check_tensor_types()  # every unsupported tensor named at once, before any work
    if dtype is None:
        return _block_model(Path(path), contents, config, arch).to(device).eval()
    items = list(contents.tensors.items())
    values = {hf_name(name): t.dequantize()
              for name, t in tqdm(items, desc="dequantize", unit="tensor", disable=not progress)}
    model = build_with_weights(config, _scratchlm_order(values, config, arch), Path(path))
    model = model.to(device=device, dtype=dtype).eval()
    if keep_quantized:
        model.quantized_weights = _quantized_weights(contents, config, arch, torch.device(device))
    return model
