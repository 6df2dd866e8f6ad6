"""Load a GGUF file (any architecture of architectures.py) as a TransformerLM: on its own blocks, or dequantized.

    model = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")              # the blocks are the weights (default)
    model = load_gguf(path, dtype=torch.float32)                      # a dense fp32 copy (training, export)
    model = load_gguf(path, dtype=torch.bfloat16, rope_style="interleaved")   # keep llama.cpp's q/k order

Steps: read the container (reader) -> the architecture's row and ModelConfig fields from the metadata, tensor
list and RoPE factor tensors (metadata_config, arch_read), which refuse what scratchlm does not compute -> the
tensors mapped to scratchlm's names and layout (state_mapping: q/k rows of the NORM-RoPE archs, Gemma's 1 + w
norms, fused qkv / gate|up, tied head) -> the model. Every step works on raw ggml rows as well as on floats:
rows of a ggml matrix are independent.

dtype=None (the default): every matrix stays in its ggml blocks (nn/block_linear.py, block_embedding.py, and
nn/block_experts.py for the 3-D expert tensors of MoE files), norms and biases become fp32; for the NORM-RoPE
architectures (llama, granite, smollm3) the RoPE style defaults to "interleaved" (the same function:
tests/interop/test_rope_interleaved.py) so q/k rows need no permuted copy. Memory is the file plus small
tensors. dtype=torch.float32 / bfloat16: every tensor dequantized (bit-exact with ggml) and cast;
`keep_quantized` then also attaches the file's matrices as `model.quantized_weights` (our name -> GGMLBlocks,
the tied head under both names, rows in the model's order) for decode="fast-gguf".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.architectures import GGUFArch
from scratchlm.interop.gguf.metadata_config import config_fields, gguf_arch
from scratchlm.interop.gguf.reader import GGUFContents, GGUFTensor, read_gguf
from scratchlm.interop.gguf.state_mapping import state_from_gguf
from scratchlm.interop.gguf.tensor_names import EXPERT_NAMES, FUSED_QKV, ROPE_TENSORS, gguf_name, split_name
from scratchlm.interop.model_build import build_with_blocks, build_with_weights
from scratchlm.model import TransformerLM
from scratchlm.nn.block_experts import BlockExperts, expert_blocks
from scratchlm.quant.blocks import GGMLBlocks


def gguf_model_config(contents: GGUFContents, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a GGUF file (overrides such as attn_impl or rope_style applied last)."""
    rope = {n: contents.tensors[n].dequantize() for n in ROPE_TENSORS if n in contents.tensors}
    fields = config_fields(contents.metadata, {n: t.shape for n, t in contents.tensors.items()}, rope)
    return ModelConfig(**{**fields, **overrides})


def _source(name: str, tensors: dict[str, GGUFTensor]) -> GGUFTensor:
    """The file tensor a (matrix) parameter of ours comes from: itself, a fused qkv / gate|up, or the embedding."""
    if name == "lm_head.weight" and "output.weight" not in tensors:
        return tensors["token_embd.weight"]
    direct = gguf_name(name)
    if direct in tensors:
        return tensors[direct]
    layer, kind, suffix = split_name(direct)
    fused = FUSED_QKV if kind in ("attn_q", "attn_k", "attn_v") else "ffn_up"
    return tensors[f"blk.{layer}.{fused}.{suffix}"]


def _raw_state(contents: GGUFContents, config: ModelConfig, arch: GGUFArch) -> dict[str, torch.Tensor]:
    """Our state with every matrix as the file's raw rows (views, no copy) and the rest dequantized; the 3-D
    expert tensors are zero-stride placeholders (BlockExperts replaces them, see _block_model)."""
    raw = {}
    for name, t in contents.tensors.items():
        if name in ROPE_TENSORS:
            continue
        kind = split_name(name)[1]
        if kind in EXPERT_NAMES:
            raw[name] = torch.zeros(()).expand(t.shape)  # no memory; never computed with
        else:  # the shared-expert gate (D,) is the (1, D) matrix of a Linear
            raw[name] = t.view() if len(t.shape) >= 2 or kind == "ffn_gate_inp_shexp" else t.dequantize()
    return state_from_gguf(raw, config, arch)


def _quantized_weights(contents: GGUFContents, config: ModelConfig, arch: GGUFArch,
                       device: torch.device) -> dict[str, GGMLBlocks]:
    rows = _raw_state(contents, config, arch)
    out = {}
    for name, r in rows.items():
        if r.dtype == torch.uint8 and r.dim() == 2:
            src = _source(name, contents.tensors)
            out[name] = GGMLBlocks(src.type_name, r.contiguous().to(device), (r.shape[0], src.shape[-1]))
    return out


def _block_experts(model: TransformerLM, contents: GGUFContents, config: ModelConfig) -> None:
    """Every MoE layer's experts on the file's 3-D expert tensors (in place)."""
    act = "silu" if config.ffn == "swiglu" else config.activation
    for i, layer in enumerate(model.model.layers):
        if not config.is_moe_layer(i):
            continue
        parts = []
        for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            t = contents.tensors[f"blk.{i}.{kind}.weight"]
            parts.append(expert_blocks(t.type_name, t.view(), t.shape))
        layer.mlp.experts = BlockExperts(*parts, activation=act, fused=config.fused_ops)


def _block_model(path: Path, contents: GGUFContents, config: ModelConfig, arch: GGUFArch) -> TransformerLM:
    """The model on the file's own blocks: matrices as GGMLBlocks over the mapped file (no copy), the rest fp32."""
    state = _raw_state(contents, config, arch)
    types = {k: _source(k, contents.tensors).type_name for k, v in state.items() if v.dtype == torch.uint8}
    model = build_with_blocks(config, state, types, path)
    _block_experts(model, contents, config)
    return model


def load_gguf(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              keep_quantized: bool = True, progress: bool = False, contents: GGUFContents | None = None,
              **config_overrides: Any) -> TransformerLM:
    """TransformerLM (eval mode) of a GGUF file, on its own blocks (dtype=None) or dequantized to `dtype`;
    see the module docstring. contents: an already parsed file (read_gguf) to avoid reading it twice.
    """
    contents = contents or read_gguf(path)
    arch = gguf_arch(contents.metadata)
    if dtype is None and arch.interleaved_qk:
        config_overrides.setdefault("rope_style", "interleaved")  # llama.cpp's q/k row order, used as is
    config = gguf_model_config(contents, **config_overrides)
    contents.check_tensor_types()  # every unsupported tensor named at once, before any work
    if dtype is None:
        return _block_model(Path(path), contents, config, arch).to(device).eval()
    items = [(n, t) for n, t in contents.tensors.items() if n not in ROPE_TENSORS]
    values = {name: t.dequantize() for name, t in tqdm(items, desc="dequantize", unit="tensor", disable=not progress)}
    model = build_with_weights(config, state_from_gguf(values, config, arch), Path(path))
    model = model.to(device=device, dtype=dtype).eval()
    if keep_quantized:
        model.quantized_weights = _quantized_weights(contents, config, arch, torch.device(device))
    return model
