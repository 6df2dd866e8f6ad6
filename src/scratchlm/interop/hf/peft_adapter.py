"""LoRA adapters in PEFT's on-disk layout: adapter_config.json + adapter_model.safetensors.

    adapter_model.safetensors   "base_model.model.<module>.lora_A.weight" (r, in) and ".lora_B.weight" (out, r)
                                for every adapted module, <module> in HF names (ours are HF Llama names)
    adapter_config.json         peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
                                target_modules, bias "none", base_model_name_or_path, ...
so `peft.PeftModel.from_pretrained(transformers_model, DIR)` applies the same update W + (alpha/r) B A
to the model that `scratchlm convert --to-hf` exports. Two mappings make that exact:
  * an "interleaved"-RoPE model is exported with its q/k rows permuted per head (interop/hf/state_dict.py);
    the rows of q_proj/k_proj's B are permuted the same way (A acts on the input and is unchanged);
  * the export family must keep our module names: Llama, Qwen2 and Qwen3 do; GPT-2 fuses q/k/v into one
    c_attn matrix, which a per-projection adapter cannot express, so it is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from scratchlm.interop.hf.config_json import export_family
from scratchlm.interop.hf.state_dict import permute_rope_heads
from scratchlm.io_utils import atomic_write, atomic_write_text, read_json_object, read_safetensors
from scratchlm.model import TransformerLM
from scratchlm.nn.lora import apply_lora, lora_layers, lora_state_dict

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def check_adapter_family(model: TransformerLM) -> None:
    """A ValueError unless the model exports to an HF family whose module names match ours (Llama/Qwen)."""
    family = export_family(model.config)
    if family == "gpt2":
        raise ValueError("a PEFT adapter for a GPT-2-family model would target its fused c_attn matrix, which "
                         "per-projection LoRA cannot express; use a Llama/Qwen-style model")


def _rope_rows(state: dict[str, torch.Tensor], model: TransformerLM, to_half: bool) -> dict[str, torch.Tensor]:
    """Permute the rows of q_proj/k_proj's B like the HF export permutes q/k (interleaved RoPE only)."""
    if model.config.pos_embedding != "rope" or model.config.rope_style != "interleaved":
        return state
    as_weights = {k.replace(".lora_B.weight", ".weight"): v for k, v in state.items() if ".lora_B." in k}
    permuted = permute_rope_heads(as_weights, model.config, to_half)
    out = dict(state)
    out.update({k.replace(".weight", ".lora_B.weight"): v for k, v in permuted.items()})
    return out


def adapter_config(model: TransformerLM, base_model: str | None) -> dict[str, Any]:
    """PEFT's LoraConfig fields for the adapters in `model` (one r / alpha / dropout for all)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA adapters to save")
    first = next(iter(layers.values()))
    if any((m.r, m.alpha, m.dropout) != (first.r, first.alpha, first.dropout) for m in layers.values()):
        raise ValueError("PEFT's layout needs one r / alpha / dropout for every adapter")
    targets = sorted({name.rsplit(".", 1)[-1] for name in layers})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": first.r, "lora_alpha": first.alpha,
            "lora_dropout": first.dropout, "target_modules": targets, "bias": "none", "fan_in_fan_out": False,
            "inference_mode": True, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
            "modules_to_save": None, "base_model_name_or_path": base_model, "revision": None}


def save_adapter(model: TransformerLM, directory: str | Path, base_model: str | None = None) -> Path:
    """Write the model's adapters to DIR in PEFT's layout (module docstring); returns DIR."""
    check_adapter_family(model)
    directory = Path(directory)
    config = adapter_config(model, base_model)
    state = _rope_rows(lora_state_dict(model), model, to_half=True)
    tensors = {PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    with atomic_write(directory / ADAPTER_WEIGHTS) as f:
        f.write(save(tensors, metadata={"format": "pt"}))
    atomic_write_text(directory / ADAPTER_CONFIG, json.dumps(config, indent=2) + "\n")
    return directory


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    """adapter_config.json, refusing adapters this module cannot apply exactly."""
    path = Path(directory) / ADAPTER_CONFIG
    cfg = read_json_object(path, f"{directory} is not a LoRA adapter: {path} is missing")
    for key, want in (("peft_type", "LORA"), ("bias", "none"), ("use_dora", False), ("use_rslora", False),
                      ("fan_in_fan_out", False)):
        if cfg.get(key, want) != want:
            raise ValueError(f"{path}: {key}={cfg.get(key)!r} is not supported (need {want!r})")
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise ValueError(f"{path}: per-module {key} is not supported; one r / lora_alpha for all modules")
    if cfg.get("modules_to_save"):
        raise ValueError(f"{path}: modules_to_save={cfg['modules_to_save']} is not supported")
    return cfg


def load_adapter(model: TransformerLM, directory: str | Path) -> TransformerLM:
    """Add the PEFT adapter in DIR to `model` (in place, unmerged); returns the model."""
    check_adapter_family(model)
    cfg = read_adapter_config(directory)
    targets = cfg["target_modules"]
    targets = [targets] if isinstance(targets, str) else list(targets)
    apply_lora(model, targets, int(cfg["r"]), float(cfg["lora_alpha"]), float(cfg.get("lora_dropout", 0.0)))
    path = Path(directory) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}")
    raw = read_safetensors(path)
    state = {k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k: v for k, v in raw.items()}
    state = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v
             for k, v in state.items()}
    state = _rope_rows(state, model, to_half=False)
    expected = lora_state_dict(model)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"adapter {directory} does not fit the model: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}")
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise ValueError(f"adapter {directory}: {k} has shape {tuple(v.shape)}, the model needs "
                             f"{tuple(expected[k].shape)}")
    model.load_state_dict(state, strict=False)
    return model


def is_adapter_dir(directory: str | Path) -> bool:
    """True when DIR holds a PEFT adapter and no full model weights."""
    d = Path(directory)
    return (d / ADAPTER_CONFIG).is_file() and not (d / "model.safetensors").exists()
