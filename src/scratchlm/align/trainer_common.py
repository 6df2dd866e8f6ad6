"""Pieces every post-training loop shares: optimizer steps, a frozen reference copy, batches, saving.

Reuses scratchlm.train: AdamW + parameter groups (build_optimizer), the LR schedules (lr_at) and
global-norm clipping (clip_grad_norm). One optimizer step s:
    lr_s = lr_at(schedule, s, lr, min_lr = 0.1 lr, warmup, total);  n = clip(grads, grad_clip);  AdamW step
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from scratchlm.checkpoint import save_model
from scratchlm.io_utils import atomic_write_text
from scratchlm.model import TransformerLM
from scratchlm.train.clip import clip_grad_norm
from scratchlm.train.optim import build_optimizer
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

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")


class Stepper:
    """AdamW over `modules` with the schedule, clipping and a non-finite-gradient guard."""

    def __init__(self, modules: list[nn.Module], cfg: OptimConfig, total_steps: int) -> None:
        self.params = [p for m in modules for p in m.parameters() if p.requires_grad]
        holder = nn.ModuleList(modules)
        self.optimizer = build_optimizer(holder, cfg.lr, cfg.weight_decay, betas=cfg.betas)
        self.cfg, self.total, self.step_count = cfg, max(1, total_steps), 0

    def step(self) -> float:
        """Clip, set lr, update, zero grads; returns the pre-clip gradient norm. Raises on inf/NaN."""
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


def save_run(model: TransformerLM, out_dir: str | Path, tok: Any | None, config: dict[str, Any],
             history: list[dict[str, Any]]) -> Path:
    """out_dir/config.json + model.safetensors (+ tokenizer files) + align_config.json + align_history.jsonl."""
    out = save_model(model, out_dir)
    if tok is not None:
        tok.save(out)
    atomic_write_text(out / "align_config.json", json.dumps(config, indent=2, default=str) + "\n")
    atomic_write_text(out / "align_history.jsonl", "".join(json.dumps(h) + "\n" for h in history))
    return out
