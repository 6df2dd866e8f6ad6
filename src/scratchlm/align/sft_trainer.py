"""SFT training loop: batches of (ids, loss_mask) -> sft_loss (token mean over assistant tokens) -> AdamW.

Gradient accumulation: a batch is run micro_batch rows at a time, each micro-batch's loss normalised by
the token count of the WHOLE batch, so the accumulated gradient equals one full-batch step (tested).
Checkpointing and --resume: align.checkpoint (weights, optimizer, RNG, data position, history).

Without packing each batch is right-padded to its longest example (pads masked out); with packing
the examples are concatenated and cut into rows of seq_len (sft.pack_examples) once, up front.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from scratchlm.align.run_state import AlignCheckpointer, CheckpointOptions
from scratchlm.align.logprobs import model_device
from scratchlm.align.sft import IGNORE, pack_examples, pad_examples, sft_labels, sft_loss
from scratchlm.align.trainer_common import IndexBatches, OptimConfig, Stepper, run_loop
from scratchlm.model import TransformerLM
from scratchlm.train.lm_loss import LM_LOSS_IMPLS, model_cross_entropy

Example = tuple[list[int], list[int]]


@dataclass
class SFTTrainConfig:
    """steps optimizer steps on batches of batch_size examples (rows when packing), each split into
    micro-batches of micro_batch rows whose losses are normalised by the whole batch's token count."""

    steps: int = 100
    batch_size: int = 8
    micro_batch: int | None = None  # None = the whole batch in one forward
    pack: bool = False
    seq_len: int = 256
    seed: int = 0
    loss_impl: str = "reference"  # train/lm_loss.py: "chunked" fuses the LM head with the loss (no whole logits)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, schedule="cosine"))

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.seq_len < 2 or (self.micro_batch or 1) < 1:
            raise ValueError(f"need steps >= 1, batch_size >= 1, micro_batch >= 1, seq_len >= 2; got {self.steps}, "
                             f"{self.batch_size}, {self.micro_batch}, {self.seq_len}")
        if self.loss_impl not in LM_LOSS_IMPLS:
            raise ValueError(f"SFTTrainConfig.loss_impl={self.loss_impl!r} is not one of {LM_LOSS_IMPLS}")


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
        ids, mask = (t.to(model_device(model)) for t in pad_examples(examples[s:s + batch_size], pad_id))
        n = float(mask[:, 1:].sum())
        total += float(sft_loss(model(ids), ids, mask)) * n
        count += n
    return total / max(count, 1.0)


def sft_model_loss(model: TransformerLM, ids: torch.Tensor, mask: torch.Tensor, n_tokens: float,
                   loss_impl: str = "reference") -> torch.Tensor:
    """sft_loss of model on (ids, mask) normalised by n_tokens, through loss_impl (reference: sft_loss on the
    logits; torch / chunked: train/lm_loss.py, the chunked one without whole logits)."""
    if loss_impl == "reference":
        return sft_loss(model(ids), ids, mask, n_tokens)
    total = model_cross_entropy(model, ids, sft_labels(ids, mask), loss_impl, reduction="sum", ignore_index=IGNORE,
                                drop_last=True)
    return total / max(float(n_tokens), 1.0)


def accumulate_sft_step(model: TransformerLM, ids: torch.Tensor, mask: torch.Tensor, micro_batch: int,
                        loss_impl: str = "reference") -> float:
    """Backward of the batch's token-mean loss, micro_batch rows at a time; returns the loss."""
    n_tokens = float(mask[:, 1:].sum())
    total = 0.0
    for s in range(0, ids.shape[0], micro_batch):
        loss = sft_model_loss(model, ids[s:s + micro_batch], mask[s:s + micro_batch], n_tokens, loss_impl)
        loss.backward()
        total += float(loss.detach())
    return total


def train_sft(model: TransformerLM, examples: list[Example], cfg: SFTTrainConfig, pad_id: int = 0,
              progress: bool = True, checkpoint: CheckpointOptions | None = None) -> list[dict[str, Any]]:
    """cfg.steps optimizer steps of SFT in place on `model`; returns per-step {"step", "loss", "tokens"}.

    checkpoint: where to checkpoint every N steps and whether to resume (align.checkpoint)."""
    torch.manual_seed(cfg.seed)
    check_lengths(examples, model.config.max_seq_len)
    packed = pack_examples(examples, cfg.seq_len) if cfg.pack else None
    if packed is not None and cfg.seq_len > model.config.max_seq_len:
        raise ValueError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={model.config.max_seq_len}")
    n_items = packed[0].shape[0] if packed is not None else len(examples)
    batches = IndexBatches(n_items, min(cfg.batch_size, n_items), cfg.seed)
    stepper = Stepper([model], cfg.optim, cfg.steps)
    ckpt = AlignCheckpointer(checkpoint, model, stepper, {}, {"trainer": "sft", **asdict(cfg)})
    device = model_device(model)

    def step_fn(step: int) -> dict[str, Any]:
        idx = next(batches)
        if packed is not None:
            ids, mask = packed[0][idx], packed[1][idx]
        else:
            ids, mask = pad_examples([examples[i] for i in idx], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        loss = accumulate_sft_step(model, ids, mask, cfg.micro_batch or ids.shape[0], cfg.loss_impl)
        grad_norm = stepper.step()
        return {"step": step, "loss": loss, "tokens": int(mask[:, 1:].sum()), "grad_norm": grad_norm}

    return run_loop("sft", cfg.steps, ckpt, batches, step_fn, progress)
