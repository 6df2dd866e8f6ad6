"""Resuming with a changed schedule: the new schedule is applied from the resumed step on, and said so.

`--resume` reads the checkpoint's step and schedule length (`total_steps`). When the resumed config
changes a field the schedule depends on (max_steps, schedule, lr, min_lr, warmup_steps, decay_frac):
    - a new max_steps > the checkpoint's step extends (or shortens) the run: total_steps = max_steps;
      max_steps <= the checkpoint's step is refused (nothing would be trained);
    - otherwise total_steps stays the checkpoint's (also a time-budget run's measured length);
    - lr(s) for the remaining steps s >= step is the new schedule's lr(s) over the new total_steps, exactly
      as if the run had been configured so from the start (a cosine or WSD decay re-stretches over the
      longer run, so the lr usually jumps up at the resume step: the note on stderr gives both values).
Unchanged schedules resume bit-identically (same lr at every step).
"""

from __future__ import annotations

from typing import Any

from scratchlm.train.train_config import TrainConfig
from scratchlm.train.schedule import lr_at

SCHEDULE_FIELDS = ("max_steps", "schedule", "lr", "min_lr", "warmup_steps", "decay_frac")


def schedule_lr(cfg: TrainConfig | dict[str, Any], step: int, total_steps: int) -> float:
    """lr at `step` of the schedule in `cfg` (a TrainConfig or its dict) stretched over `total_steps`."""
    c = cfg if isinstance(cfg, dict) else cfg.to_dict()
    return lr_at(c["schedule"], step, c["lr"], c["min_lr"], min(c["warmup_steps"], total_steps), total_steps,
                 c["decay_frac"])


def resumed_total_steps(saved: dict[str, Any], cfg: TrainConfig, step: int, total_steps: int,
                        ckpt: str) -> tuple[int, str | None]:
    """(total_steps to continue with, a note for stderr or None); see the module docstring."""
    changed = {k: (saved.get(k), getattr(cfg, k)) for k in SCHEDULE_FIELDS if saved.get(k) != getattr(cfg, k)}
    if not changed:
        return total_steps, None
    new_total = total_steps
    if "max_steps" in changed:
        if cfg.max_steps <= step:
            raise ValueError(f"--resume: {ckpt} is at step {step} but max_steps={cfg.max_steps}; nothing would be "
                             f"trained. Pass --max_steps greater than {step} to extend the run")
        new_total = cfg.max_steps
    if step >= total_steps and new_total == total_steps:
        return total_steps, None  # a finished run that is not extended: nothing to train, nothing changes
    before = schedule_lr(saved, step, total_steps)
    after = schedule_lr(cfg, step, new_total)
    what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
    return new_total, (f"resume: schedule changed ({what}); steps {step + 1}..{new_total} follow the new "
                       f"{cfg.schedule} schedule over {new_total} steps: lr at step {step + 1} is {after:.3g} "
                       f"(the old schedule had {before:.3g})")
