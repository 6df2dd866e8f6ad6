"""SFT loss: only assistant tokens count, token-mean normalisation, accumulation, padding and packing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchlm.align.sft import pack_examples, pad_examples, sft_loss


def test_sft_loss_counts_only_masked_targets():
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    nll = [-torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]] for b in range(2) for t in range(1, 5) if mask[b, t]]
    expect = torch.stack(nll).mean()
    assert sft_loss(logits, ids, mask).item() == pytest.approx(expect.item(), rel=1e-6)
    labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 7), labels.reshape(-1), ignore_index=-100)
    assert sft_loss(logits, ids, mask).item() == pytest.approx(ref.item(), rel=1e-6)
    assert sft_loss(logits, ids, torch.zeros_like(mask)).item() == 0.0  # nothing to learn -> 0, not NaN


def test_accumulation_with_global_token_count_equals_one_batch():
    logits = torch.randn(4, 6, 9, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 9, (4, 6))
    mask = torch.randint(0, 2, (4, 6))
    n = int(mask[:, 1:].sum())
    full = sft_loss(logits, ids, mask)
    parts = sft_loss(logits[:2], ids[:2], mask[:2], num_tokens=n) + sft_loss(logits[2:], ids[2:], mask[2:], num_tokens=n)
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)  # cross_entropy runs in fp32


def test_pad_and_pack():
    ex = [([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1]), ([6, 7, 8, 9], [0, 0, 1, 1])]
    ids, mask = pad_examples(ex, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]]
    assert mask.tolist() == [[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 1, 1]]
    pids, pmask = pack_examples(ex, seq_len=4)
    assert pids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]] and pmask.tolist() == [[0, 1, 1, 0], [1, 0, 0, 1]]
    with pytest.raises(ValueError, match="seq_len=40"):
        pack_examples(ex, seq_len=40)
    with pytest.raises(ValueError, match="example 0"):
        pad_examples([([1, 2], [1])])
