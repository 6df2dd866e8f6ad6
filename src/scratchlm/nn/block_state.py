"""The dense state of a model whose matrices may be ggml blocks (nn/block_linear.py, block_embedding.py,
block_experts.py): its state_dict with every block matrix dequantized to fp32 under the name its dense
twin has ("....weight"; a tied head reading the embedding's blocks under both names).

A block layer's bytes are a non-persistent buffer (they belong to the GGUF file, not to a checkpoint), so a
plain state_dict of such a model would silently lack its matrices: everything that writes a model (a
scratchlm checkpoint, save_pretrained, a GGUF export, a merged QLoRA run) reads this instead.
"""

from __future__ import annotations

import torch
from torch import nn


def has_blocks(model: nn.Module) -> bool:
    """True when some matrix of the model is kept in ggml blocks."""
    return any(b.dtype == torch.uint8 for b in model.buffers())


def dense_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """model.state_dict() plus every block module's dequantized weight(s) (see the module docstring)."""
    state = model.state_dict()
    owners: list[str] = []  # modules whose dense_weights cover their children (BlockExperts' BlockLinears)
    for name, module in model.named_modules():
        dense = getattr(module, "dense_weights", None)
        if not callable(dense) or any(name.startswith(o + ".") for o in owners):
            continue
        owners.append(name)
        prefix = f"{name}." if name else ""
        state.update({prefix + k: v for k, v in dense().items()})
    return state
