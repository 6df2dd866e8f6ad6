"""Learning-rate schedules as pure functions of the (0-based) optimizer step.

warmup (both):  lr(s) = max_lr * (s + 1) / W                     for s < W
cosine:         lr(s) = min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2,  p = (s - W) / (S - W)
wsd:            lr(s) = max_lr in the stable phase W <= s < S - D, then linear to min_lr:
                lr(s) = max_lr + (min_lr - max_lr) * (s - (S - D) + 1) / D   for the last D steps
with S = total_steps, D = round(decay_frac * S). Past S both stay at min_lr. Because lr depends
only on the step, a resumed run follows exactly the same schedule.
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "wsd", "constant")


def _check(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> None:
    if not 0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr}, max_lr={max_lr}")
    if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
        raise ValueError(f"need 0 <= warmup_steps <= total_steps and total_steps > 0, "
                         f"got warmup_steps={warmup_steps}, total_steps={total_steps}")


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup then cosine decay from max_lr to the floor min_lr at total_steps."""
    _check(max_lr, min_lr, warmup_steps, total_steps)
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def wsd_lr(
    step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int, decay_frac: float = 0.2
) -> float:
    """Warmup-stable-decay: linear warmup, constant max_lr, linear decay to min_lr over the last decay_frac."""
    _check(max_lr, min_lr, warmup_steps, total_steps)
    if not 0.0 <= decay_frac <= 1.0:
        raise ValueError(f"decay_frac must be in [0, 1], got {decay_frac}")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    decay_steps = round(decay_frac * total_steps)
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return max_lr
    return max_lr + (min_lr - max_lr) * (step - decay_start + 1) / decay_steps


def lr_at(
    schedule: str, step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int,
    decay_frac: float = 0.2,
) -> float:
    """Dispatch on the schedule name ("cosine" | "wsd" | "constant" = warmup then max_lr)."""
    if schedule == "cosine":
        return cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps)
    if schedule == "wsd":
        return wsd_lr(step, max_lr, min_lr, warmup_steps, total_steps, decay_frac)
    if schedule == "constant":
        return wsd_lr(step, max_lr, min_lr, warmup_steps, total_steps, 0.0)
    raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}")
