"""A training run's output directory: fresh runs need a new or empty out_dir (or --overwrite).

The general rule and its helpers live in `scratchlm.io_utils` (check_output_path, claim_run_dir);
this adds what is particular to training: a checkpoint already there is named with its step and the
`--resume` alternative, and `--overwrite` refuses to move away the run's own inputs (train_data,
val_data, tokenizer_dir) when they lie inside out_dir.
"""

from __future__ import annotations

from pathlib import Path

from scratchlm.io_utils import check_output_path
from scratchlm.train.checkpoint import find_checkpoint, read_state_json
from scratchlm.train.train_config import TrainConfig


def check_fresh_out_dir(cfg: TrainConfig, overwrite: bool) -> None:
    """Raise a one-line error unless a fresh run may write cfg.out_dir (see module docstring)."""
    out = Path(cfg.out_dir)
    ckpt = find_checkpoint(out) if out.is_dir() else None
    if ckpt is not None and not overwrite:
        step = read_state_json(ckpt)["trainer"]["step"]
        raise FileExistsError(f"out_dir {out} already holds a checkpoint at step {step}; pass --resume to continue "
                              "it, --overwrite to replace the run, or choose another out_dir (nothing was changed)")
    for key in ("train_data", "val_data", "tokenizer_dir"):
        value = getattr(cfg, key)
        if overwrite and value and out.resolve() in Path(value).resolve().parents:
            raise ValueError(f"{key} {value} lies inside out_dir {out}, which --overwrite would delete; "
                             "move it out or choose another out_dir")
    check_output_path(out, "dir", overwrite, "out_dir")
