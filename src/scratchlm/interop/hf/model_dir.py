"""`load_hf_dir(dir)` and `save_pretrained(model, dir)`: HF-layout checkpoints <-> TransformerLM.

An HF directory holds config.json (with `model_type`) + model.safetensors, or shards listed in
model.safetensors.index.json (+ tokenizer.json). Weights are loaded as fp32 master weights by default
(bf16/fp16 checkpoints are upcast). Any model path (scratchlm dir, GGUF file, adapter) goes through
`scratchlm.load.from_pretrained`, which calls this for HF directories.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from scratchlm.nn.block_state import dense_state_dict
from scratchlm.interop.hf.config_json import VLM_TEXT, config_from_hf, config_to_hf, export_family, hf_family
from scratchlm.interop.hf.state_dict import state_from_hf, state_to_hf, stored_head_differs
from scratchlm.interop.hf.safetensors_shards import load_sharded, save_sharded
from scratchlm.interop.hf.tokenizer_copy import save_hf_tokenizer
from scratchlm.io_utils import atomic_write_text, read_json_object
from scratchlm.interop.model_build import build_with_weights
from scratchlm.model import TransformerLM

CONFIG_NAME = "config.json"


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """DIR/config.json as a dict, with clear errors for a missing or corrupt file."""
    path = Path(directory) / CONFIG_NAME
    return read_json_object(path, f"{directory} is not a model directory: {path} is missing")


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "architectures" in data


def text_model_tensors(hf_state: dict[str, torch.Tensor], prefix: str, directory: Path) -> dict[str, torch.Tensor]:
    """A vision-language checkpoint's text-model tensors (names without `prefix`; transformers v5's
    `model.language_model.` layout too); the vision tower and projector are dropped, with a warning."""
    out, dropped = {}, 0
    for key, tensor in hf_state.items():
        if key.startswith(prefix):
            out[key[len(prefix):]] = tensor
        elif key.startswith("model.language_model."):
            out["model." + key[len("model.language_model."):]] = tensor
        elif key == "lm_head.weight":
            out[key] = tensor
        else:
            dropped += 1
    warnings.warn(f"{directory}: loading the text model of a vision-language checkpoint; its vision tower and "
                  f"projector ({dropped} tensors) are not loaded (scratchlm is text-only); save_pretrained writes "
                  "the text model alone", stacklevel=3)
    return out


def load_hf_dir(directory: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                progress: bool = False, **config_overrides: Any) -> TransformerLM:
    """Load a Hugging Face checkpoint directory (any family in interop/hf/families.py) as a TransformerLM.

    config_overrides replace ModelConfig fields that do not change the weights' meaning, e.g.
    attn_impl="sdpa" or rope_style="interleaved" (q/k rows are then permuted to match).
    """
    directory = Path(directory)
    data = read_config_json(directory)
    if not is_hf_config(data):
        raise ValueError(f"{directory}/config.json has no model_type or architectures: not a Hugging Face "
                         "checkpoint (load it with scratchlm.load.from_pretrained)")
    config = config_from_hf(data, **config_overrides)
    family = hf_family(data)
    hf_state = load_sharded(directory, progress=progress)
    if data.get("model_type") in VLM_TEXT:
        hf_state = text_model_tensors(hf_state, VLM_TEXT[data["model_type"]][2], directory)
    if config.tie_embeddings and stored_head_differs(hf_state):
        warnings.warn(f"{directory}: config.json says tie_word_embeddings=true but the checkpoint stores a separate "
                      "lm_head.weight that differs from the embedding; loading it untied, as transformers does",
                      stacklevel=2)
        config = config.replace(tie_embeddings=False)
    state = state_from_hf(hf_state, config, family)
    model = build_with_weights(config, state, directory)
    return model.to(device=device, dtype=dtype).eval()


def save_pretrained(model: TransformerLM, directory: str | Path, *, max_shard_size: int | str = "5GB",
                    dtype: torch.dtype | None = None, tokenizer: Any = None, bos_token_id: int | None = None,
                    eos_token_id: int | None = None, progress: bool = False) -> Path:
    """Write `model` in the HF layout transformers loads with AutoModelForCausalLM.from_pretrained.

    The family (llama / qwen2 / qwen3 / gpt2) follows from model.config (see config_json.export_family);
    a config HF cannot represent exactly raises ValueError naming the field. Weights are sharded with
    an index above max_shard_size ("500MB", "2GB" or bytes); dtype casts them (default: as stored);
    a scratchlm Tokenizer is written as tokenizer.json.
    """
    if not isinstance(model, TransformerLM):
        raise ValueError(f"save_pretrained needs a scratchlm TransformerLM, got {type(model).__name__}")
    config = model.config
    family = export_family(config)
    state = state_to_hf(dense_state_dict(model), config, family)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    stored = next(iter(state.values())).dtype
    extra = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "dtype": str(stored).removeprefix("torch.")}
    hf = config_to_hf(config, family, extra)
    directory = Path(directory)
    save_sharded(state, directory, max_shard_size=max_shard_size, progress=progress)
    atomic_write_text(directory / CONFIG_NAME, json.dumps(hf, indent=2) + "\n")
    if tokenizer is not None:
        save_hf_tokenizer(tokenizer, directory)
    return directory
