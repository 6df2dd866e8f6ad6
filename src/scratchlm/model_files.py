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
    model = TransformerLM(config)
    if config.tie_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {directory} does not match its config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return model.to(map_location)
