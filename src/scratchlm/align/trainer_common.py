"""Pieces every post-training loop shares: optimizer steps, the frozen reference, batches, the resumable
step loop, saving.

Reuses scratchlm.train: AdamW + parameter groups (build_optimizer), the LR schedules (lr_at) and
global-norm clipping (clip_grad_norm). One optimizer step s:
    lr_s = lr_at(schedule, s, lr, min_lr = 0.1 lr, warmup, total);  n = clip(grads, grad_clip);  AdamW step
Numerics (OptimConfig): `precision` fp32 | bf16-mixed (train/precision.py: every forward/backward of a step
under bf16 autocast; master weights, gradients, AdamW state, clipping and the update in fp32);
`optimizer_impl` reference | torch (our AdamW, or torch's fused one: tested equal in tests/train/test_optim.py).
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn
from tqdm import tqdm

from scratchlm.align.logprobs import model_device
from scratchlm.align.run_state import AlignCheckpointer
from scratchlm.io_utils import atomic_write_text
from scratchlm.model import TransformerLM
from scratchlm.nn.lora import adapters_disabled, lora_layers
from scratchlm.train.clip import clip_grad_norm
from scratchlm.train.host_memory import keep_host_memory
from scratchlm.train.optim import OPTIMIZER_IMPLS, build_optimizer
from scratchlm.train.precision import autocast, check_precision, full_precision
from scratchlm.train.schedule import lr_at


@dataclass
class OptimConfig:
    """Optimizer and schedule of a post-training run (lr is the peak; cosine to 0.1 lr by default)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "constant"
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    precision: str = "fp32"  # or "bf16-mixed" (module docstring)
    optimizer_impl: str = "reference"  # or "torch" (fused AdamW)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")
        check_precision(self.precision, "precision")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(f"optimizer_impl={self.optimizer_impl!r} is not one of {OPTIMIZER_IMPLS}")


class Stepper:
    """AdamW over `modules` with the schedule, clipping and a non-finite-gradient guard."""

    def __init__(self, modules: list[nn.Module], cfg: OptimConfig, total_steps: int) -> None:
        keep_host_memory()  # the step's activations stay in the heap between steps (train/host_memory.py)
        self.params = [p for m in modules for p in m.parameters() if p.requires_grad]
        holder = nn.ModuleList(modules)
        self.optimizer = build_optimizer(holder, cfg.lr, cfg.weight_decay, betas=cfg.betas, impl=cfg.optimizer_impl)
        self.cfg, self.total, self.step_count = cfg, max(1, total_steps), 0

    def step(self) -> float:
        """Clip, set lr, update, zero grads (fp32, outside any autocast); returns the pre-clip gradient norm.
        Raises on inf/NaN."""
        with full_precision(self.params[0].device if self.params else "cpu"):
            return self._step()

    def _step(self) -> float:
        norm = float(clip_grad_norm(self.params, self.cfg.grad_clip))
        if not math.isfinite(norm):
            raise ValueError(f"gradient norm is {norm} at step {self.step_count}; lower the learning rate "
                             f"(lr={self.cfg.lr}) or check the data")
        lr = lr_at(self.cfg.schedule, self.step_count, self.cfg.lr, 0.1 * self.cfg.lr,
                   min(self.cfg.warmup_steps, self.total), self.total)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        return norm


def frozen_copy(model: TransformerLM) -> TransformerLM:
    """A detached, eval-mode copy (the reference policy pi_ref)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class BaseModelView(nn.Module):
    """A LoRA policy with its adapters bypassed: the frozen base model, used as pi_ref without a copy."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        with adapters_disabled(self.policy):
            return self.policy(input_ids)


def make_reference(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """(pi_ref, the module a checkpoint must save for it): the base model itself for a LoRA policy (nothing to
    save: it is the frozen part of the policy), else a frozen copy of the model as it is now."""
    if lora_layers(model):
        return BaseModelView(model), None
    ref = frozen_copy(model)
    return ref, ref


def run_loop(name: str, total_steps: int, ckpt: AlignCheckpointer, batches: IndexBatches | None,
             step_fn: Callable[[int], dict[str, Any]], progress: bool = True, show: tuple[str, ...] = ("loss",),
             on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Steps ckpt.start().step .. total_steps - 1 of `step_fn(step) -> metrics record`, checkpointing as due;
    each step runs under the stepper's OptimConfig.precision (bf16-mixed: autocast).

    Resuming restores weights, optimizer, RNG, the data position and the history before the first step,
    so the run continues exactly where the checkpoint left it. Returns the history of every step.
    """
    state = ckpt.start()
    if batches is not None:
        batches.restore(state.data)
    bar = tqdm(range(state.step, total_steps), desc=name, disable=not progress, initial=state.step,
               total=total_steps)
    precision, device = ckpt.stepper.cfg.precision, model_device(ckpt.policy)
    for step in bar:
        with autocast(precision, device):  # the step's forwards and backwards (Stepper.step leaves it)
            record = step_fn(step)
        state.history.append(record)
        state.step = step + 1
        state.data = batches.state() if batches is not None else {}
        ckpt.after_step(state, total_steps)
        bar.set_postfix({k: f"{record[k]:.4f}" for k in show if isinstance(record.get(k), float)})
        if on_step is not None:
            on_step(record)
    return state.history


def index_batches(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless batches of indices into n items: shuffled epochs from a seeded RNG (wraps across epochs)."""
    if n <= 0 or batch_size <= 0:
        raise ValueError(f"need at least one example and batch_size >= 1, got n={n}, batch_size={batch_size}")
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order += epoch
        yield order[:batch_size]
        order = order[batch_size:]


class IndexBatches:
    """index_batches with a resumable position: the state is the number of batches drawn so far."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.drawn = 0
        self._it = index_batches(n, batch_size, seed)

    def __iter__(self) -> "IndexBatches":
        return self

    def __next__(self) -> list[int]:
        self.drawn += 1
        return next(self._it)

    def state(self) -> dict[str, int]:
        return {"batches_drawn": self.drawn}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue after state["batches_drawn"] batches (replayed from the seed: the order is a pure function)."""
        self._it = index_batches(self.n, self.batch_size, self.seed)
        self.drawn = 0
        for _ in range(int(state.get("batches_drawn", 0))):
            next(self)


def save_run(out_dir: str | Path, tok: Any | None, config: dict[str, Any], history: list[dict[str, Any]]) -> Path:
    """out_dir/ tokenizer files + align_config.json + align_history.jsonl (the model is written by the caller)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tok is not None:
        tok.save(out)
    atomic_write_text(out / "align_config.json", json.dumps(config, indent=2, default=str) + "\n")
    atomic_write_text(out / "align_history.jsonl", "".join(json.dumps(h) + "\n" for h in history))
    return out
