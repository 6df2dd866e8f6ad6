"""Training checkpoints: model + optimizer + trainer state, swapped in as one directory.

OUT/checkpoint/ holds
    config.json, model.safetensors        scratchlm.model_files.save_model (loadable with load_model)
    trainer_state.safetensors             optimizer moments + RNG states (tensors; never pickle);
                                          FSDP runs gather their sharded moments into the same
                                          unsharded layout, so any run can resume any checkpoint
    trainer_state.json                    step, tokens seen, data position, optimizer hyperparameters,
                                          python/numpy RNG, the TrainConfig (everything that is not a tensor)
    tokenizer files                       copied from TrainConfig.tokenizer_dir, when given
Atomicity: everything is written into OUT/.checkpoint.tmp, then swapped with OUT/checkpoint in one
step (Linux renameat2 RENAME_EXCHANGE; elsewhere the old one is renamed to OUT/.checkpoint.old first).
The previous checkpoint is then kept as OUT/checkpoint-STEP (keep_last > 1: the newest keep_last - 1 of
them are kept) or deleted. A crash at any moment leaves a complete OUT/checkpoint, or a complete
OUT/.checkpoint.old or OUT/checkpoint-STEP, which `find_checkpoint` (resume) falls back to.
Weights fingerprint: trainer_state.json records the SHA-256 of model.safetensors; resuming from a
checkpoint whose weights file was replaced since (e.g. by `scratchlm convert --out ... --overwrite`)
is refused instead of pairing new weights with the old optimizer moments.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save

from scratchlm.model_files import CONFIG_NAME, WEIGHTS_NAME, load_config, load_model, save_model
from scratchlm.io_utils import atomic_write, atomic_write_text, exchange_paths, read_json_object, read_safetensors
from scratchlm.model import TransformerLM

STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
FORMAT = "scratchlm-trainer-state-v1"


@dataclass
class TrainerState:
    """Everything besides weights and optimizer moments that an exact resume needs."""

    step: int = 0  # optimizer steps completed
    tokens_seen: int = 0
    total_steps: int = 0  # the schedule's length (max_steps, or fixed from a time budget)
    data_position: dict[str, int] = field(default_factory=dict)  # SequentialBatches state
    last_val_loss: float | None = None
    loss_ema: float = 0.0  # the divergence guard's running average (train/guard.py), not bias-corrected
    loss_ema_steps: int = 0


def checkpoint_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoint"


def kept_checkpoints(out_dir: str | Path) -> list[Path]:
    """OUT/checkpoint-STEP directories (keep_last > 1), oldest first."""
    found = [p for p in Path(out_dir).glob("checkpoint-*") if p.name[11:].isdigit() and (p / STATE_JSON).exists()]
    return sorted(found, key=lambda p: int(p.name[11:]))


def find_checkpoint(out_dir: str | Path) -> Path | None:
    """OUT/checkpoint; after a crash between renames OUT/.checkpoint.old or the newest OUT/checkpoint-STEP."""
    for p in (checkpoint_path(out_dir), Path(out_dir) / ".checkpoint.old", *reversed(kept_checkpoints(out_dir))):
        if (p / STATE_JSON).exists():
            return p
    return None


def weights_fingerprint(ckpt: Path) -> str:
    """SHA-256 of CKPT/model.safetensors."""
    with open(ckpt / WEIGHTS_NAME, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def index_keyed(sd: dict[str, Any]) -> dict[str, Any]:
    """A parameter-name-keyed optimizer state dict (torch.distributed's full state dict under FSDP) ->
    the index-keyed layout of optimizer.state_dict(): index = position in the concatenated groups."""
    names = [n for g in sd["param_groups"] for n in g["params"]]
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]]
    return {"state": {index[n]: st for n, st in sd["state"].items()}, "param_groups": groups}


def name_keyed(sd: dict[str, Any]) -> dict[str, Any]:
    """Inverse of index_keyed, using each group's "names" (build_optimizer records them)."""
    names = [n for g in sd["param_groups"] for n in g["names"]]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": {names[i]: st for i, st in sd["state"].items()}, "param_groups": groups}


def optimizer_split(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An index-keyed optimizer state dict as (tensors for safetensors, JSON-able rest)."""
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optimizer.{idx}.{k}"] = v.detach().to("cpu").contiguous()
            else:
                scalars[f"{idx}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def rng_split() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng.torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return tensors, {"python": [version, list(mt), gauss], "numpy": [name, keys.tolist(), pos, has_gauss, cached]}


def _write_state(tmp: Path, optimizer_state: dict[str, Any] | None, state: TrainerState,
                 train_config: dict[str, Any]) -> None:
    """trainer_state.{safetensors,json} into `tmp` (after model.safetensors, whose fingerprint it records)."""
    opt_tensors, opt_meta = optimizer_split(optimizer_state) if optimizer_state is not None else ({}, None)
    rng_tensors, rng_meta = rng_split()
    blob = save({**opt_tensors, **rng_tensors}, metadata={"format": FORMAT})
    with atomic_write(tmp / STATE_TENSORS) as f:
        f.write(blob)
    meta = {"format": FORMAT, "trainer": dataclasses.asdict(state), "optimizer": opt_meta, "rng": rng_meta,
            "weights_sha256": weights_fingerprint(tmp), "train_config": train_config}
    atomic_write_text(tmp / STATE_JSON, json.dumps(meta, indent=1) + "\n")


def save_checkpoint(
    out_dir: str | Path, model: TransformerLM, optimizer_state: dict[str, Any] | None, state: TrainerState,
    train_config: dict[str, Any], tokenizer_dir: str | Path | None = None, keep_last: int = 1,
) -> Path:
    """Write the whole checkpoint into a temp dir, then swap it in (see module docstring).

    optimizer_state: optimizer.state_dict() (index-keyed; see index_keyed for FSDP's name-keyed one).
    keep_last: how many checkpoints to keep, this one included (older ones as OUT/checkpoint-STEP)."""
    out_dir = Path(out_dir)
    tmp = out_dir / ".checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tmp)
    _write_state(tmp, optimizer_state, state, train_config)
    if tokenizer_dir:
        for f in sorted(Path(tokenizer_dir).iterdir()):
            if f.is_file() and f.name not in (CONFIG_NAME, WEIGHTS_NAME, STATE_JSON, STATE_TENSORS):
                with atomic_write(tmp / f.name) as dst:
                    dst.write(f.read_bytes())
    return swap_in_checkpoint(out_dir, keep_last)


def swap_in_checkpoint(out_dir: str | Path, keep_last: int = 1) -> Path:
    """Make the complete OUT/.checkpoint.tmp the new OUT/checkpoint (module docstring: an atomic exchange,
    or two renames with OUT/.checkpoint.old in between, which find_checkpoint falls back to); the replaced
    one is kept as OUT/checkpoint-STEP when keep_last > 1."""
    out_dir = Path(out_dir)
    tmp, old, final = out_dir / ".checkpoint.tmp", out_dir / ".checkpoint.old", checkpoint_path(out_dir)
    if not final.exists():
        os.replace(tmp, final)
        previous = old if (old / STATE_JSON).exists() else None  # left by a crash between the two renames
    elif exchange_paths(tmp, final):
        previous = tmp  # now holds the checkpoint that was in place
    else:
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        previous = old
    if previous is not None:
        _keep_or_delete(out_dir, previous, keep_last)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _keep_or_delete(out_dir: Path, previous: Path, keep_last: int) -> None:
    """Keep the replaced checkpoint as OUT/checkpoint-STEP when keep_last > 1; prune beyond keep_last."""
    if keep_last > 1:
        kept = out_dir / f"checkpoint-{read_state_json(previous)['trainer']['step']}"
        shutil.rmtree(kept, ignore_errors=True)
        os.replace(previous, kept)
    else:
        shutil.rmtree(previous, ignore_errors=True)
    kept_now = kept_checkpoints(out_dir)
    for stale in kept_now[: max(0, len(kept_now) - (keep_last - 1))]:
        shutil.rmtree(stale, ignore_errors=True)


def read_state_json(ckpt: Path) -> dict[str, Any]:
    """trainer_state.json with clear errors for missing, foreign or corrupt files."""
    path = ckpt / STATE_JSON
    meta = read_json_object(path, f"{ckpt} is not a scratchlm training checkpoint: {path} is missing")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a scratchlm trainer state (format {FORMAT!r} expected)")
    return meta


def _check_same_model(ckpt: Path, model: TransformerLM) -> None:
    saved = load_config(ckpt).to_dict()
    now = model.config.to_dict()
    diff = {k: (saved[k], now[k]) for k in now if saved.get(k) != now[k]}
    if diff:
        raise ValueError(
            f"cannot resume from {ckpt}: its model config differs from this run's in {diff} (checkpoint, now); "
            "resume with the same model settings or start a fresh run in another out_dir"
        )


def _check_fingerprint(ckpt: Path, meta: dict[str, Any]) -> None:
    """Refuse weights that are not the ones this trainer state was saved with (module docstring)."""
    saved = meta.get("weights_sha256")  # absent in checkpoints written before fingerprints
    if saved and (ckpt / WEIGHTS_NAME).exists() and weights_fingerprint(ckpt) != saved:
        raise ValueError(
            f"cannot resume from {ckpt}: {WEIGHTS_NAME} is not the file this checkpoint saved (its SHA-256 "
            "differs from trainer_state.json's weights_sha256; was it replaced, e.g. by `scratchlm convert`?). "
            "Resuming would pair these weights with another model's optimizer state; start a fresh run in "
            "another out_dir instead"
        )


def saved_optimizer_state(optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None,
                           ckpt: Path) -> dict[str, Any]:
    """The checkpoint's optimizer state as an index-keyed state dict, checked against `optimizer`."""
    if meta is None:
        raise ValueError(f"cannot resume from {ckpt}: it holds no optimizer state; start a new run from its "
                         "weights instead")
    saved_names = [g.get("names") for g in meta["param_groups"]]
    now_names = [g.get("names") for g in optimizer.param_groups]
    if saved_names != now_names:
        raise ValueError(f"cannot resume from {ckpt}: the optimizer's parameter groups differ from this model's")
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        if key.startswith("optimizer."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = v
    for key, v in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = v
    groups = [{**g, "betas": tuple(g["betas"])} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def restore_rng(tensors: dict[str, torch.Tensor], rng: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, mt, gauss = rng["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def load_checkpoint(ckpt: str | Path, model: TransformerLM, optimizer: torch.optim.Optimizer,
                    sharded: torch.nn.Module | None = None) -> TrainerState:
    """Load weights, optimizer state and RNG states in place; returns the TrainerState to continue from.

    sharded: the FSDP2-sharded model (under torchrun with fsdp=true): every rank reads the full tensors
    and torch.distributed.checkpoint.state_dict scatters its shards of weights and moments."""
    ckpt = Path(ckpt)
    meta = read_state_json(ckpt)
    _check_same_model(ckpt, model)
    _check_fingerprint(ckpt, meta)
    weights = load_model(ckpt).state_dict()
    if sharded is None:
        model.load_state_dict(weights)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(sharded, weights, options=StateDictOptions(full_state_dict=True))
    path = ckpt / STATE_TENSORS
    if not path.exists():
        raise FileNotFoundError(f"{ckpt} has {STATE_JSON} but no {STATE_TENSORS}; the checkpoint is incomplete")
    tensors = read_safetensors(path)
    opt_state = saved_optimizer_state(optimizer, tensors, meta["optimizer"], ckpt)
    if sharded is None:
        optimizer.load_state_dict(opt_state)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(sharded, optimizer, name_keyed(opt_state),
                                 options=StateDictOptions(full_state_dict=True))
    restore_rng(tensors, meta["rng"])
    return TrainerState(**meta["trainer"])
