"""Model checkpoints: DIR/config.json (ModelConfig) + DIR/model.safetensors (weights).

Never pickle: weights go through safetensors. A tied LM head is stored once (as
model.embed_tokens.weight) and re-tied on load. Every file is written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save

from scratchlm.nn.block_state import dense_state_dict
from scratchlm.config import ModelConfig
from scratchlm.io_utils import atomic_write, atomic_write_text, read_json_object, read_safetensors
from scratchlm.model import TransformerLM
from scratchlm.nn.rope import RotaryEmbedding

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def model_state_for_save(model: TransformerLM) -> dict[str, torch.Tensor]:
    """state_dict with the tied head dropped and every tensor contiguous on CPU."""
    state = dense_state_dict(model)  # a model on ggml blocks: its matrices dequantized
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def save_model(model: TransformerLM, directory: str | Path) -> Path:
    """Write config.json and model.safetensors into `directory` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    blob = save(model_state_for_save(model), metadata={"format": "pt", "library": "scratchlm"})
    with atomic_write(directory / WEIGHTS_NAME) as f:
        f.write(blob)
    atomic_write_text(directory / CONFIG_NAME, json.dumps(model.config.to_dict(), indent=2) + "\n")
    return directory


def load_config(directory: str | Path) -> ModelConfig:
    """Read DIR/config.json with a clear error when it is missing or not a scratchlm config."""
    path = Path(directory) / CONFIG_NAME
    data = read_json_object(path, f"{directory} is not a scratchlm checkpoint: {path} is missing")
    if "model_type" in data or "architectures" in data:
        raise ValueError(
            f"{path} is a Hugging Face config; convert it first: scratchlm convert --from-hf {directory} --out DIR"
        )
    return ModelConfig.from_dict(data)


def load_model(directory: str | Path, map_location: str | torch.device = "cpu", **config_overrides) -> TransformerLM:
    """Build the model from DIR/config.json and load DIR/model.safetensors strictly."""
    directory = Path(directory)
    config = load_config(directory)
    if config_overrides:
        config = config.replace(**config_overrides)
    weights = directory / WEIGHTS_NAME
    if not weights.exists():
        raise FileNotFoundError(f"{directory} has a config but no {WEIGHTS_NAME}; the checkpoint is incomplete")
    state = read_safetensors(weights, device=str(map_location))
    if config.tie_embeddings and "model.embed_tokens.weight" in state:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    return model_from_state(config, state, directory).to(map_location)


def check_state(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], directory: Path) -> None:
    """Raise a one-line ValueError naming missing / unexpected / wrongly shaped tensors of `state`."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k}: checkpoint {tuple(state[k].shape)} vs config {tuple(expected[k].shape)}"
             for k in sorted(set(state) & set(expected)) if state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(f"checkpoint {directory} does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, wrong shapes {wrong[:3]}")


def finish_meta_build(model: TransformerLM, directory: Path) -> TransformerLM:
    """A meta-built model after its tensors were assigned: RoPE tables computed on CPU, nothing left on meta."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding) and module.cos.is_meta:
            module.init_tables(device="cpu")
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"internal error: tensors {left[:5]} were not materialised after loading {directory}")
    return model


def model_from_state(config: ModelConfig, state: dict[str, torch.Tensor], directory: Path) -> TransformerLM:
    """TransformerLM holding exactly `state` (floats as fp32), without a wasted random init.

    The model is built on the meta device (no memory, no init), the loaded tensors are assigned as its
    parameters, the tied head is re-tied, and the non-persistent RoPE tables are computed on CPU.
    """
    with torch.device("meta"):
        model = TransformerLM(config)
    check_state(model.state_dict(), state, directory)
    model.load_state_dict({k: v.to(torch.float32) if v.is_floating_point() else v for k, v in state.items()},
                          strict=True, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return finish_meta_build(model, directory)
