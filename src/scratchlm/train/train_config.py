"""TrainConfig: every knob of a pretraining run, validated; JSON files and --key=value overrides.

Model: `model_preset` (a ModelConfig preset) plus `model` overrides ({"n_layers": 6, ...}); when
`model` has no vocab_size, the token file's vocab_size is used. Config files are JSON (never exec'd).
Overrides use the field name (`lr=3e-4`) or `model.FIELD` for the architecture (`model.n_layers=6`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.field_types import check_field_types
from scratchlm.io_utils import read_json_object
from scratchlm.train.lm_loss import LM_LOSS_IMPLS
from scratchlm.train.optim import OPTIMIZER_IMPLS
from scratchlm.train.precision import PRECISIONS
from scratchlm.train.schedule import SCHEDULES

CHOICES = {
    "schedule": SCHEDULES,
    "sampler": ("random", "sequential"),
    "dtype": ("fp32", "bf16"),
    "device": ("auto", "cpu", "cuda"),
    "optimizer_impl": OPTIMIZER_IMPLS,
    "loss_impl": LM_LOSS_IMPLS,
}
POSITIVE_INTS = ("batch_size", "seq_len", "grad_accum", "max_steps", "eval_interval", "eval_batches",
                 "ckpt_interval", "log_interval", "keep_last")
NON_NEGATIVE = ("warmup_steps", "stop_at_step", "max_time_s", "min_lr", "weight_decay", "grad_clip", "z_loss",
                "peak_gflops", "num_threads", "seed", "spike_factor", "weight_growth_factor")


@dataclass
class TrainConfig:
    """A pretraining run (see docs/training.md for each field)."""

    model_preset: str = "llama-tiny"
    model: dict[str, Any] = field(default_factory=dict)
    train_data: str = ""
    val_data: str = ""
    val_fraction: float = 0.1
    sampler: str = "random"
    tokenizer_dir: str = ""
    out_dir: str = "runs/train"
    batch_size: int = 8
    seq_len: int = 128
    grad_accum: int = 1
    max_steps: int = 1000
    stop_at_step: int = 0
    max_time_s: float = 0.0
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    schedule: str = "cosine"
    decay_frac: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    optimizer_impl: str = "reference"
    loss_impl: str = "reference"
    dtype: str = "fp32"  # the older name of precision: "bf16" = "bf16-mixed" (kept in sync with it)
    precision: str = ""  # "fp32" | "bf16-mixed" (train/precision.py); "" = as dtype says
    device: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False  # recompute each block in the backward: less memory, ~1/3 more compute
    fsdp: bool = False
    seed: int = 1337
    eval_interval: int = 100
    eval_batches: int = 20
    ckpt_interval: int = 500
    keep_last: int = 1  # checkpoints kept: OUT/checkpoint + the newest keep_last - 1 as OUT/checkpoint-STEP
    spike_factor: float = 3.0  # divergence guard: stop when loss > factor x running average (0 = off)
    weight_growth_factor: float = 100.0  # divergence guard: never save weights grown > factor x the last saved (0 = off)
    log_interval: int = 10
    peak_gflops: float = 0.0
    num_threads: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        check_field_types(self)  # "--lr=fast", "--compile=maybe": a ValueError naming the field
        for name in POSITIVE_INTS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {v!r}")
        for name in NON_NEGATIVE:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"TrainConfig.{name} must be a number >= 0, got {v!r}")
        for name, valid in CHOICES.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is not one of {valid}")
        self._resolve_precision()
        self._check_ranges()

    def _resolve_precision(self) -> None:
        """precision and its older name dtype name one setting: either turns bf16 on; they may not disagree."""
        implied = "bf16-mixed" if self.dtype == "bf16" else "fp32"
        if self.precision == "":
            self.precision = implied
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision={self.precision!r} is not one of {PRECISIONS}")
        if self.precision == "bf16-mixed" and self.dtype == "fp32":
            self.dtype = "bf16"
        elif self.precision != implied:
            raise ValueError(f"TrainConfig.precision={self.precision!r} and dtype={self.dtype!r} disagree (dtype is "
                             f"precision's older name: bf16 = bf16-mixed); set precision only")

    def _check_ranges(self) -> None:
        if not self.lr > 0 or self.min_lr > self.lr:
            raise ValueError(f"TrainConfig needs lr > 0 and 0 <= min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")
        if self.warmup_steps > self.max_steps:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps} exceeds max_steps={self.max_steps}")
        if self.stop_at_step > self.max_steps:
            raise ValueError(f"TrainConfig.stop_at_step={self.stop_at_step} exceeds max_steps={self.max_steps}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("val_fraction",):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"TrainConfig.{name} must be in (0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.decay_frac <= 1.0 or not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"TrainConfig.decay_frac and label_smoothing must be in [0, 1], "
                             f"got {self.decay_frac} and {self.label_smoothing}")
        if not self.eps > 0:
            raise ValueError(f"TrainConfig.eps must be > 0, got {self.eps}")
        if 0 < self.spike_factor <= 1:
            raise ValueError(f"TrainConfig.spike_factor must be > 1 (a multiple of the running loss) or 0 (off), "
                             f"got {self.spike_factor}")
        if 0 < self.weight_growth_factor <= 1:
            raise ValueError(f"TrainConfig.weight_growth_factor must be > 1 (a multiple of the last saved weights' "
                             f"size) or 0 (off), got {self.weight_growth_factor}")
        if not isinstance(self.model, dict):
            raise ValueError(f"TrainConfig.model must be a dict of ModelConfig overrides, got {self.model!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> "TrainConfig":
        data = read_json_object(path, f"config file {path} does not exist")
        return cls.from_dict(data)

    def with_overrides(self, overrides: dict[str, Any]) -> "TrainConfig":
        """A validated copy with `overrides` ({"lr": 3e-4, "model.n_layers": 6}) applied."""
        data = self.to_dict()
        data["model"] = dict(data["model"])
        if "dtype" in overrides and "precision" not in overrides:
            data["precision"] = ""  # follow the overriding older name
        if "precision" in overrides and "dtype" not in overrides:
            data["dtype"] = "fp32"  # resynced from the new precision
        for key, value in overrides.items():
            if key.startswith("model."):
                data["model"][key[len("model."):]] = value
            else:
                data[key] = value
        return TrainConfig.from_dict(data)


def _coerce(raw: str) -> Any:
    """Parse a command-line value: JSON when it parses (numbers, bools, null), else the raw string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        lowered = raw.lower()
        return {"true": True, "false": False}.get(lowered, raw)


def parse_cli_overrides(args: list[str]) -> dict[str, Any]:
    """["--lr=3e-4", "--model.n_layers", "6"] -> {"lr": 3e-4, "model.n_layers": 6}; dashes -> underscores."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ValueError(f"unexpected argument {arg!r}; overrides look like --key=value (e.g. --lr=3e-4)")
        key, sep, raw = arg[2:].partition("=")
        if not sep:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError(f"override --{key} has no value; write --{key}=VALUE")
            raw, i = args[i + 1], i + 1
        out[key.replace("-", "_")] = _coerce(raw)
        i += 1
    return out
