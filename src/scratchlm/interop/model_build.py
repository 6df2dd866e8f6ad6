"""Build a TransformerLM that holds given tensors, without a wasted random init (shared by the HF and GGUF loaders).

`build_with_weights`: every tensor a dense fp32 parameter. `build_with_blocks`: the matrices stay in the
ggml blocks they were stored in (nn/block_linear.py, nn/block_embedding.py: a GGUF model whose weights
are the file's own bytes); norms and biases are small fp32 parameters.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scratchlm.config import ModelConfig
from scratchlm.model import TransformerLM
from scratchlm.model_files import check_state, finish_meta_build, model_from_state
from scratchlm.nn.block_embedding import BlockEmbedding
from scratchlm.nn.block_linear import BlockLinear
from scratchlm.quant.blocks import GGMLBlocks


def build_with_weights(config: ModelConfig, state: dict[str, torch.Tensor], directory: Path) -> TransformerLM:
    """TransformerLM holding exactly `state` (as fp32), without a wasted random init
    (model_files.model_from_state: the checkpoint loader builds the same way)."""
    return model_from_state(config, state, directory)


def _set_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def build_with_blocks(config: ModelConfig, state: dict[str, torch.Tensor], types: dict[str, str],
                      directory: Path) -> TransformerLM:
    """TransformerLM holding `state`, where every uint8 2-D tensor named in `types` is the raw ggml rows of
    a matrix of that type (a ggml row of K values is one run of blocks) and the rest are floats (as fp32).

    Every Linear / Embedding whose weight is such rows becomes a BlockLinear / BlockEmbedding over those
    bytes (its bias, if any, from `state`); a tied head reads the embedding's blocks. Nothing is
    dequantized or copied.
    """
    with torch.device("meta"):
        model = TransformerLM(config)
    expected = model.state_dict()
    blocks = {k: GGMLBlocks(types[k], v, tuple(expected[k].shape)) for k, v in state.items()
              if k in types and v.dtype == torch.uint8 and k in expected and expected[k].dim() == 2}
    shapes = {k: (torch.empty(blocks[k].shape, device="meta") if k in blocks else v) for k, v in state.items()}
    check_state(expected, shapes, directory)
    embed = "model.embed_tokens.weight"
    for name, b in blocks.items():
        module_name = name.removesuffix(".weight")
        if name == embed:
            _set_module(model, module_name, BlockEmbedding(b))
        elif name != "lm_head.weight" or not config.tie_embeddings:
            bias = state.get(f"{module_name}.bias")
            _set_module(model, module_name, BlockLinear(b, None if bias is None else bias.to(torch.float32)))
    if config.tie_embeddings and embed in blocks:
        model.lm_head = BlockLinear(blocks[embed])
    given = {name.removesuffix(".weight") + ".bias" for name in blocks}  # biases now inside a BlockLinear
    rest = {k: v.to(torch.float32) for k, v in state.items() if k not in blocks and k not in given}
    model.load_state_dict(rest, strict=False, assign=True)
    if config.tie_embeddings and embed not in blocks:
        model.lm_head.weight = model.model.embed_tokens.weight
    return finish_meta_build(model, directory)
