"""DPO training loop: policy and frozen reference sequence log-prob sums -> dpo_loss -> AdamW.

Each batch scores [chosen; rejected] in ONE forward of the policy (and one of the reference, no grad),
then splits it in two (trl's layout). The reference defaults to a frozen copy of the starting model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from scratchlm.align.run_state import AlignCheckpointer, CheckpointOptions
from scratchlm.align.dpo import DPO_LOSS_TYPES, dpo_loss
from scratchlm.align.logprobs import sequence_logprobs
from scratchlm.align.trainer_common import IndexBatches, OptimConfig, Stepper, make_reference, run_loop
from scratchlm.model import TransformerLM

Pair = tuple[list[int], list[int], list[int]]  # prompt ids, chosen ids, rejected ids


@dataclass
class DPOTrainConfig:
    steps: int = 100
    batch_size: int = 8
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    seed: int = 0
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))

    def __post_init__(self) -> None:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"DPOTrainConfig.loss_type={self.loss_type!r} is not one of {DPO_LOSS_TYPES}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"need steps >= 1 and batch_size >= 1, got {self.steps}, {self.batch_size}")


def pair_logprobs(model: TransformerLM, pairs: list[Pair]) -> tuple[torch.Tensor, ...]:
    """(S(chosen), S(rejected), |chosen|, |rejected|), each (B,), from one forward over [chosen; rejected]."""
    prompts = [p for p, _, _ in pairs] * 2
    completions = [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    sums, counts = sequence_logprobs(model, prompts, completions)
    b = len(pairs)
    return sums[:b], sums[b:], counts[:b], counts[b:]


@torch.no_grad()
def preference_accuracy(model: TransformerLM, pairs: list[Pair], batch_size: int = 32) -> float:
    """Fraction of pairs where the model itself prefers the chosen completion: S(y_w) > S(y_l)."""
    wins = 0
    for s in range(0, len(pairs), batch_size):
        c, r, _, _ = pair_logprobs(model, pairs[s:s + batch_size])
        wins += int((c > r).sum())
    return wins / len(pairs)


def train_dpo(model: TransformerLM, pairs: list[Pair], cfg: DPOTrainConfig, ref: TransformerLM | None = None,
              progress: bool = True, checkpoint: CheckpointOptions | None = None) -> list[dict[str, Any]]:
    """cfg.steps DPO steps in place on `model` against `ref` (default: a frozen copy of model now, or the
    base model under a LoRA policy); checkpoint: every-N-steps checkpoints and resume (align.checkpoint)."""
    torch.manual_seed(cfg.seed)
    if ref is None:
        ref, ref_part = make_reference(model)
    else:
        ref_part = ref
    stepper = Stepper([model], cfg.optim, cfg.steps)
    batches = IndexBatches(len(pairs), min(cfg.batch_size, len(pairs)), cfg.seed)
    ckpt = AlignCheckpointer(checkpoint, model, stepper, {"reference": ref_part}, {"trainer": "dpo", **asdict(cfg)})

    def step_fn(step: int) -> dict[str, Any]:
        batch = [pairs[i] for i in next(batches)]
        pc, pr, nc, nr = pair_logprobs(model, batch)
        with torch.no_grad():
            rc, rr, _, _ = pair_logprobs(ref, batch)
        loss, metrics = dpo_loss(pc, pr, rc, rr, cfg.beta, cfg.loss_type, cfg.label_smoothing, nc, nr)
        loss.backward()
        grad_norm = stepper.step()
        return {"step": step, "loss": float(loss.detach()), "grad_norm": grad_norm, **metrics}

    return run_loop("dpo", cfg.steps, ckpt, batches, step_fn, progress, show=("loss", "rewards/accuracies"))
