"""Build a TransformerLM that holds given tensors, without a wasted random init (shared by the HF and GGUF loaders)."""

from __future__ import annotations

from pathlib import Path

import torch

from scratchlm.config import ModelConfig
from scratchlm.model import TransformerLM
from scratchlm.nn.rope import RotaryEmbedding


def _check_state(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], directory: Path) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k}: checkpoint {tuple(state[k].shape)} vs config {tuple(expected[k].shape)}"
             for k in sorted(set(state) & set(expected)) if state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(f"checkpoint {directory} does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, wrong shapes {wrong[:3]}")


def build_with_weights(config: ModelConfig, state: dict[str, torch.Tensor], directory: Path) -> TransformerLM:
    """TransformerLM holding exactly `state` (as fp32), without a wasted random init.

    The model is built on the meta device (no memory, no init), the loaded tensors are assigned as its
    parameters, the tied head is re-tied, and the non-persistent RoPE tables are computed on CPU.
    """
    with torch.device("meta"):
        model = TransformerLM(config)
    _check_state(model.state_dict(), state, directory)
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.init_tables(device="cpu")
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"internal error: tensors {left[:5]} were not materialised after loading {directory}")
    return model
