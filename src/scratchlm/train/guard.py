"""The divergence guard: stop a run whose loss blows up before it can save bad weights over good ones.

A run stops with `TrainingDiverged` (a ValueError: one line, exit 2 on the command line), before the
optimizer update and before any save, when
    - the loss or the gradient norm is inf/NaN, or
    - the loss spikes: loss > spike_factor * m  and  loss > m + SPIKE_MIN_NATS, where m is the running
      average of the training loss (EMA, m_n = beta * m_{n-1} + (1 - beta) * loss_n, bias-corrected by
      1 - beta^n, beta = 0.9); spike_factor = 0 turns this check off; or
    - before a checkpoint replaces the previous one: a weight is inf/NaN; or the weights grew more than
      weight_growth_factor x since the last saved ones (the checkpoint on disk, or the initial weights
      before the first save): growth = max(||w|| / ||w_saved||, max|w| / max|w_saved|) with ||.|| the L2
      norm over all parameters (0 = off; a blown-up update can leave the loss finite and even unchanged,
      e.g. lr 1e9 moved weights to ~1e9 while the probe loss stayed at ln V: every logit saturated); or
      the loss of the weights about to be saved on the last step's first micro-batch spikes by the loss
      rule (the last update may have blown them up after the step's own loss was measured; the batch it
      was computed on shows it first).
So the checkpoint on disk always holds weights that passed the guard, and a run that stops names the
step of the checkpoint it leaves in place. The running average is part of the trainer state, so a
resumed run applies the same rule as an uninterrupted one; the weights it compares against are the
checkpoint it resumed from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

SPIKE_MIN_NATS = 1.0  # a spike must also exceed the average by this much (tiny losses do not trip it)
EMA_BETA = 0.9


class TrainingDiverged(ValueError):
    """The loss spiked or became inf/NaN, or the weights did; nothing was saved after the last good checkpoint."""


@dataclass(frozen=True)
class WeightStats:
    """Size of a set of weights: the L2 norm over all parameters and the largest |w|, after `step` steps."""

    norm: float
    max_abs: float
    step: int

    def growth_since(self, saved: "WeightStats") -> float:
        """max(norm / saved.norm, max_abs / saved.max_abs); a zero saved size counts as no growth limit."""
        ratios = [a / b for a, b in ((self.norm, saved.norm), (self.max_abs, saved.max_abs)) if b > 0]
        return max(ratios, default=1.0)

    def describe(self) -> str:
        return f"max |w| {self.max_abs:.3g}, L2 norm {self.norm:.4g}"


@dataclass(frozen=True)
class LastGood:
    """The checkpoint a stopped run leaves in place: its directory and step (None: nothing saved yet)."""

    path: str | None
    step: int | None = None

    def __str__(self) -> str:
        if self.path is None:
            return "no checkpoint was written yet"
        return f"the last good checkpoint (step {self.step}) in {self.path} is intact"


Where = Union[LastGood, Callable[[], LastGood]]  # a callable is asked only when the run stops


class DivergenceGuard:
    """Running average of the loss and the checks of the module docstring."""

    def __init__(self, spike_factor: float, ema: float = 0.0, n: int = 0, weight_growth_factor: float = 0.0) -> None:
        self.spike_factor, self.ema, self.n = spike_factor, ema, n
        self.weight_growth_factor = weight_growth_factor

    @property
    def average(self) -> float | None:
        """The bias-corrected running average (None before the first loss)."""
        return self.ema / (1.0 - EMA_BETA**self.n) if self.n else None

    def spike(self, loss: float) -> bool:
        """Is `loss` a spike against the running average (module docstring)?"""
        avg = self.average
        return bool(self.spike_factor and avg is not None and loss > self.spike_factor * avg
                    and loss > avg + SPIKE_MIN_NATS)

    def check_step(self, step: int, loss: float, grad_norm: float, lr: float, where: Where) -> None:
        """Raise TrainingDiverged for a non-finite loss/norm or a spike; else fold the loss into the average."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise TrainingDiverged(f"training diverged at step {step + 1}: loss={loss}, grad_norm={grad_norm} "
                                   f"(lr={lr:.3g}); {self._advice(where)}")
        if self.spike(loss):
            raise TrainingDiverged(f"training diverged at step {step + 1}: loss {loss:.4g} is more than "
                                   f"spike_factor={self.spike_factor:g} x the running average {self.average:.4g} "
                                   f"(lr={lr:.3g}); {self._advice(where)}")
        self.ema = EMA_BETA * self.ema + (1.0 - EMA_BETA) * loss
        self.n += 1

    def check_before_save(self, step: int, weights_finite: bool, probe_loss: float, where: Where,
                          weights: WeightStats | None = None, saved: WeightStats | None = None) -> None:
        """Raise TrainingDiverged if a weight is inf/NaN, the weights to save grew more than
        weight_growth_factor x since `saved` (the last saved weights), or their probe loss spikes."""
        if not weights_finite:
            raise TrainingDiverged(f"training diverged at step {step}: some weights are inf/NaN; "
                                   f"{self._advice(where)}")
        if self.weight_growth_factor and weights is not None and saved is not None:
            growth = weights.growth_since(saved)
            if growth > self.weight_growth_factor:
                before = "the initial weights" if saved.step == 0 else f"the weights saved at step {saved.step}"
                raise TrainingDiverged(
                    f"training diverged at step {step}: the weights to save grew {growth:.3g}x since {before} "
                    f"({weights.describe()} against {saved.describe()}; weight_growth_factor="
                    f"{self.weight_growth_factor:g}, probe loss {probe_loss:.4g}); {self._advice(where)}")
        if not math.isfinite(probe_loss) or self.spike(probe_loss):
            avg = f"{self.average:.4g}" if self.average is not None else "n/a"
            raise TrainingDiverged(f"training diverged at step {step}: the weights to save have probe loss "
                                   f"{probe_loss:.4g} against a running average of {avg} "
                                   f"(spike_factor={self.spike_factor:g}); {self._advice(where)}")

    @staticmethod
    def _advice(where: Where) -> str:
        return (f"stopped without saving, {where() if callable(where) else where}. Lower lr, keep grad_clip > 0, or train in fp32, then "
                "--resume (or raise spike_factor / weight_growth_factor, 0 = off)")
