"""The training progress bar: steps, or for a fresh time-budget run the seconds of the budget.

A step bar's total is the schedule's length, known up front. A time-budget run (max_time_s) sizes its
schedule from the measured step time after ~25 steps and again a fifth of the way in, so any step total
would jump (2000 -> 58 -> 66; a first ETA of 1:29:01). Its bar shows only what is known: seconds elapsed
of the budget (the bar, exact ETA), the steps done so far (no total) and the measured loss / tok/s.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


class TrainProgress:
    """tqdm bar for `Trainer.run` (see module docstring); disabled off rank 0 or with progress=false."""

    def __init__(self, total_steps: int, step: int, budget_s: float | None, enabled: bool) -> None:
        self.budget_s, self.fields = budget_s, {}
        if budget_s:
            self.bar = tqdm(total=round(budget_s), desc="train", unit="s", dynamic_ncols=True, disable=not enabled,
                            bar_format="{l_bar}{bar}| {n:.0f}/{total}s [{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=total_steps, initial=step, desc="train", dynamic_ncols=True, disable=not enabled)

    def advance(self, step: int, total_steps: int, elapsed_s: float) -> None:
        """One optimizer step done (`step` completed of `total_steps`, `elapsed_s` into the run)."""
        if self.budget_s:
            self.bar.n = min(elapsed_s, self.budget_s)
            self.show(step=str(step))  # steps done; the schedule's length is an estimate that moves
        else:
            self.bar.total = total_steps
            self.bar.update(1)

    def show(self, **fields: Any) -> None:
        """Update the postfix fields shown beside the bar (loss, tok_s, mfu, step)."""
        self.fields.update(fields)
        self.bar.set_postfix(self.fields)

    def write(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        if self.budget_s:
            self.bar.n = self.bar.total  # the run ended: by its schedule or by the clock
            self.bar.refresh()
        self.bar.close()
