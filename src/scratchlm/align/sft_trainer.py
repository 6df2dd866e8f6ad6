"""SFT training loop: batches of (ids, loss_mask) -> sft_loss (token mean over assistant tokens) -> AdamW.

Without packing each batch is right-padded to its longest example (pads masked out); with packing
the examples are concatenated and cut into rows of seq_len (sft.pack_examples) once, up front.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from scratchlm.align.sft import pack_examples, pad_examples, sft_loss
from scratchlm.align.trainer_common import OptimConfig, Stepper, index_batches
from scratchlm.model import TransformerLM

Example = tuple[list[int], list[int]]


@dataclass
class SFTTrainConfig:
    steps: int = 100
    batch_size: int = 8
    pack: bool = False
    seq_len: int = 256
    seed: int = 0
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, schedule="cosine"))

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.seq_len < 2:
            raise ValueError(f"need steps >= 1, batch_size >= 1, seq_len >= 2; got {self.steps}, "
                             f"{self.batch_size}, {self.seq_len}")


def check_lengths(examples: list[Example], max_len: int) -> None:
    """A ValueError naming the first example longer than the model context."""
    for i, (ids, _) in enumerate(examples):
        if len(ids) > max_len:
            raise ValueError(f"example {i} has {len(ids)} tokens > the model's max_seq_len={max_len}; "
                             "shorten it, drop it, or use a model with a longer context")


@torch.no_grad()
def sft_eval_loss(model: TransformerLM, examples: list[Example], batch_size: int = 16, pad_id: int = 0) -> float:
    """Token-mean assistant-token loss over all examples (the quantity SFT lowers)."""
    total, count = 0.0, 0.0
    for s in range(0, len(examples), batch_size):
        ids, mask = (t.to(model.lm_head.weight.device) for t in pad_examples(examples[s:s + batch_size], pad_id))
        n = float(mask[:, 1:].sum())
        total += float(sft_loss(model(ids), ids, mask)) * n
        count += n
    return total / max(count, 1.0)


def train_sft(model: TransformerLM, examples: list[Example], cfg: SFTTrainConfig, pad_id: int = 0,
              progress: bool = True) -> list[dict[str, Any]]:
    """cfg.steps optimizer steps of SFT in place on `model`; returns per-step {"step", "loss", "tokens"}."""
    torch.manual_seed(cfg.seed)
    check_lengths(examples, model.config.max_seq_len)
    packed = pack_examples(examples, cfg.seq_len) if cfg.pack else None
    if packed is not None and cfg.seq_len > model.config.max_seq_len:
        raise ValueError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={model.config.max_seq_len}")
    n_items = packed[0].shape[0] if packed is not None else len(examples)
    batches = index_batches(n_items, min(cfg.batch_size, n_items), cfg.seed)
    stepper = Stepper([model], cfg.optim, cfg.steps)
    device = model.lm_head.weight.device
    history = []
    bar = tqdm(range(cfg.steps), desc="sft", disable=not progress)
    for step in bar:
        idx = next(batches)
        if packed is not None:
            ids, mask = packed[0][idx], packed[1][idx]
        else:
            ids, mask = pad_examples([examples[i] for i in idx], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        loss = sft_loss(model(ids), ids, mask)
        loss.backward()
        grad_norm = stepper.step()
        history.append({"step": step, "loss": float(loss.detach()), "tokens": int(mask[:, 1:].sum()),
                        "grad_norm": grad_norm})
        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}")
    return history
