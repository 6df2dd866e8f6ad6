"""Supervised fine-tuning loss: next-token cross entropy on assistant tokens only, and optional packing.

Shapes: ids (B, T), loss_mask (B, T) with 1 where token t is an assistant token the model must predict
(render_chat's mask: assistant content and its closing <|im_end|>).
Targets are ids shifted left by one; target t+1 counts iff loss_mask[t+1] = 1.
Normalisation (stated, spec §8): the mean over every counted token of the batch,
    loss = sum_{b,t} m_{b,t+1} nll_{b,t} / N,   N = num_tokens or sum m
which is F.cross_entropy(ignore_index) on one batch. Pass num_tokens (the count over all
micro-batches of one optimizer step) so gradient accumulation gives the same gradient as one big batch.

Tensor-level form for any causal LM (`sft_microbatch_train_step`, masked-sum convention, spec §8):
    loss = -sum_{b,t} M_{b,t} logp_{b,t} / normalize_constant / gradient_accumulation_steps
With normalize_constant = the response-token count of the whole accumulated batch and
gradient_accumulation_steps = 1 it equals sft_loss's token mean over that batch.

Packing concatenates examples into rows of exactly seq_len tokens; attention is NOT blocked at
example boundaries (later examples can see earlier ones, as in pretraining), positions run on.
"""

from __future__ import annotations

import torch

from scratchlm.align.logprobs import masked_normalize
from scratchlm.train.losses import cross_entropy

IGNORE = -100


def sft_labels(ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """targets (B, T-1): ids[:, 1:] where loss_mask[:, 1:] is 1, else -100 (ignored)."""
    return ids[:, 1:].masked_fill(loss_mask[:, 1:] == 0, IGNORE)


def sft_loss(logits: torch.Tensor, ids: torch.Tensor, loss_mask: torch.Tensor,
             num_tokens: float | None = None) -> torch.Tensor:
    """Token-mean NLL of assistant tokens (module docstring). logits (B, T, V); 0 when nothing counts."""
    labels = sft_labels(ids, loss_mask)  # (B, T-1)
    total = cross_entropy(logits[:, :-1], labels, ignore_index=IGNORE, reduction="sum")
    n = float((labels != IGNORE).sum()) if num_tokens is None else float(num_tokens)
    return total / max(n, 1.0)


def sft_microbatch_train_step(policy_log_probs: torch.Tensor, response_mask: torch.Tensor,
                              gradient_accumulation_steps: int = 1, normalize_constant: float = 1.0,
                              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The masked-sum SFT loss of one micro-batch (module docstring); calls backward(). (B, T) inputs."""
    if gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
    loss = -masked_normalize(policy_log_probs, response_mask, normalize_constant) / gradient_accumulation_steps
    loss.backward()
    return loss.detach(), {"tokens": response_mask.bool().sum()}


def pad_examples(examples: list[tuple[list[int], list[int]]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad (ids, loss_mask) examples to the longest: ids (B, T), loss_mask (B, T) (0 on pads)."""
    t = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), t), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), t, dtype=torch.long)
    for b, (x, m) in enumerate(examples):
        if len(x) != len(m):
            raise ValueError(f"example {b}: {len(x)} ids but {len(m)} loss-mask entries; they must match")
        ids[b, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[b, : len(m)] = torch.tensor(m, dtype=torch.long)
    return ids, mask


def pack_examples(examples: list[tuple[list[int], list[int]]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate (ids, loss_mask) examples and cut into full rows of seq_len (the tail is dropped)."""
    flat_ids = [t for ids, _ in examples for t in ids]
    flat_mask = [m for _, mask in examples for m in mask]
    rows = len(flat_ids) // seq_len
    if rows == 0:
        raise ValueError(f"packing needs at least seq_len={seq_len} tokens, the examples have {len(flat_ids)}; "
                         "lower seq_len or turn packing off")
    n = rows * seq_len
    ids = torch.tensor(flat_ids[:n], dtype=torch.long).reshape(rows, seq_len)
    return ids, torch.tensor(flat_mask[:n], dtype=torch.long).reshape(rows, seq_len)
