"""Post-training checkpoints: everything a bit-identical resume needs, swapped in as one directory.

OUT/checkpoint/ holds, after step s:
    config.json + model.safetensors     the policy (full fine-tuning; `load_model` reads the directory)
    adapters.safetensors                the policy's LoRA adapters instead (LoRA runs); its frozen base is
                                        re-read from the starting checkpoint and must match the sha256
                                        fingerprint recorded here
    <part>.safetensors                  every other trained or frozen module: `reference` (the frozen copy
                                        of the starting policy), `critic` (PPO's value model)
    trainer_state.safetensors           optimizer moments + the torch RNG state
    trainer_state.json                  format, step s, data position, the metrics history, python/numpy
                                        RNG, the trainer config, the base fingerprint
Rollouts never span a step (each step samples, scores and updates), so the data position and the
per-step sampling seeds are the whole rollout state. Writes go to OUT/.checkpoint.tmp and are swapped in
by train.checkpoint.swap_in_checkpoint: a SIGKILL at any moment leaves OUT/checkpoint or
OUT/.checkpoint.old complete (find_checkpoint returns whichever holds trainer_state.json).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save
from torch import nn

from scratchlm.model_files import load_model, save_model
from scratchlm.io_utils import atomic_write, atomic_write_text, read_json_object, read_safetensors
from scratchlm.nn.lora import lora_layers, lora_state_dict
from scratchlm.train.checkpoint import (STATE_JSON, STATE_TENSORS, find_checkpoint, optimizer_split, restore_rng,
                                        rng_split, saved_optimizer_state, swap_in_checkpoint)

FORMAT = "scratchlm-align-state-v1"
ADAPTERS = "adapters.safetensors"


@dataclass
class CheckpointOptions:
    """Where and how often a post-training run checkpoints. out_dir None = never (library use)."""

    out_dir: str | Path | None = None
    every: int = 0  # optimizer/rollout steps between checkpoints; 0 = none
    resume: bool = False

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"checkpoint every={self.every} must be >= 0 (0 = only at the end)")
        if self.resume and self.out_dir is None:
            raise ValueError("resume needs the out_dir that holds the checkpoint")


@dataclass
class RunState:
    """The loop's own state: steps done, their metrics, and the data position."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def frozen_fingerprint(model: nn.Module) -> str:
    """sha256 over the names and bytes of the parameters that do not train (a LoRA run's base model) and of
    the ggml block buffers (a QLoRA base kept in its blocks)."""
    h = hashlib.sha256()
    frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
    blocks = [(n, b) for n, b in model.named_buffers() if b.dtype == torch.uint8]
    for name, p in sorted(frozen + blocks, key=lambda item: item[0]):
        h.update(name.encode())
        h.update(p.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _shared_keys(module: nn.Module) -> set[str]:
    """State-dict keys whose tensor shares storage with an earlier key (a tied LM head)."""
    seen, shared = set(), set()
    for k, v in module.state_dict().items():
        ptr = v.untyped_storage().data_ptr()
        if ptr in seen:
            shared.add(k)
        seen.add(ptr)
    return shared


def _module_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict on CPU, a tied tensor stored once (safetensors refuses shared storage)."""
    shared = _shared_keys(module)
    return {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items() if k not in shared}


def _load_module(module: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    if unexpected or set(missing) - _shared_keys(module):
        raise ValueError(f"{path} does not fit this run's module: missing {sorted(set(missing))[:4]}, unexpected "
                         f"{sorted(unexpected)[:4]}")


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_write(path) as f:
        f.write(save(tensors, metadata={"format": FORMAT}))


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the checkpoint is incomplete")
    return read_safetensors(path)


class AlignCheckpointer:
    """Saves and restores one post-training run (module docstring).

    policy: the trained model (LoRA-wrapped or not); parts: other modules to save by name;
    stepper: the run's trainer_common.Stepper (optimizer + its step count); config: the trainer config
    (JSON-able), recorded and checked on resume.
    """

    def __init__(self, opts: CheckpointOptions | None, policy: nn.Module, stepper: Any,
                 parts: dict[str, nn.Module | None], config: dict[str, Any]) -> None:
        self.opts = opts or CheckpointOptions()
        self.policy, self.stepper = policy, stepper
        self.config = json.loads(json.dumps(config, default=str))  # as it reads back from JSON
        self.parts = {k: v for k, v in parts.items() if v is not None}
        self.lora = bool(lora_layers(policy))
        self.fingerprint = frozen_fingerprint(policy) if self.lora else None

    @property
    def enabled(self) -> bool:
        return self.opts.out_dir is not None

    def start(self) -> RunState:
        """A fresh RunState, or the restored one of the latest checkpoint when resuming."""
        if not self.opts.resume:
            return RunState()
        ckpt = find_checkpoint(self.opts.out_dir)
        if ckpt is None:
            raise FileNotFoundError(f"--resume: {self.opts.out_dir} holds no checkpoint to resume from; start "
                                    "without --resume")
        return self.restore(ckpt)

    def after_step(self, state: RunState, total_steps: int) -> None:
        """Checkpoint every `every` steps; not after the last one (the finished model is published instead)."""
        if self.enabled and self.opts.every > 0 and state.step % self.opts.every == 0 and state.step < total_steps:
            self.save(state)

    def save(self, state: RunState) -> Path:
        out = Path(self.opts.out_dir)
        tmp = out / ".checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.lora:
            _save_tensors(tmp / ADAPTERS, {k: v.detach().to("cpu").contiguous()
                                           for k, v in lora_state_dict(self.policy).items()})
        else:
            save_model(self.policy, tmp)
        for name, module in self.parts.items():
            _save_tensors(tmp / f"{name}.safetensors", _module_state(module))
        opt_tensors, opt_meta = optimizer_split(self.stepper.optimizer.state_dict())
        rng_tensors, rng_meta = rng_split()
        _save_tensors(tmp / STATE_TENSORS, {**opt_tensors, **rng_tensors})
        meta = {"format": FORMAT, "step": state.step, "optimizer_steps": self.stepper.step_count,
                "data": state.data, "history": state.history,
                "optimizer": opt_meta, "rng": rng_meta, "config": self.config, "lora": self.lora,
                "base_fingerprint": self.fingerprint}
        atomic_write_text(tmp / STATE_JSON, json.dumps(meta, indent=1) + "\n")
        return swap_in_checkpoint(out)

    def _check_meta(self, ckpt: Path) -> dict[str, Any]:
        meta = read_json_object(ckpt / STATE_JSON, f"{ckpt} has no {STATE_JSON}")
        if meta.get("format") != FORMAT:
            raise ValueError(f"{ckpt / STATE_JSON} is not a post-training checkpoint (format {FORMAT!r} expected)")
        if meta["lora"] != self.lora:
            raise ValueError(f"cannot resume from {ckpt}: it was {'a LoRA' if meta['lora'] else 'a full'} "
                             f"fine-tuning run and this one is {'LoRA' if self.lora else 'full'}")
        if meta["base_fingerprint"] != self.fingerprint:
            raise ValueError(f"cannot resume from {ckpt}: the starting checkpoint's weights changed since the run "
                             "began (their sha256 differs); resume from the same --checkpoint")
        differ = sorted(k for k in set(meta["config"]) | set(self.config)
                        if meta["config"].get(k) != self.config.get(k))
        if differ:
            raise ValueError(f"cannot resume from {ckpt}: its settings differ in {differ} (checkpoint "
                             f"{ {k: meta['config'].get(k) for k in differ} }); resume with the same flags")
        return meta

    def restore(self, ckpt: Path) -> RunState:
        """Load weights, optimizer, RNG and the loop state from `ckpt` in place."""
        meta = self._check_meta(ckpt)
        if self.lora:
            adapters = _load_tensors(ckpt / ADAPTERS)
            if sorted(adapters) != sorted(lora_state_dict(self.policy)):
                raise ValueError(f"cannot resume from {ckpt}: its adapters do not match this run's LoRA layers")
            self.policy.load_state_dict(adapters, strict=False)
        else:
            self.policy.load_state_dict(load_model(ckpt).state_dict())
        for name, module in self.parts.items():
            _load_module(module, _load_tensors(ckpt / f"{name}.safetensors"), ckpt / f"{name}.safetensors")
        tensors = _load_tensors(ckpt / STATE_TENSORS)
        optimizer = self.stepper.optimizer
        optimizer.load_state_dict(saved_optimizer_state(optimizer, tensors, meta["optimizer"], ckpt))
        self.stepper.step_count = meta["optimizer_steps"]
        restore_rng(tensors, meta["rng"])
        return RunState(step=meta["step"], history=meta["history"], data=meta["data"])
