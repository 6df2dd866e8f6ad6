"""A model trained a few optimizer steps with scratchlm exports to HF and transformers reproduces its logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import scratchlm
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM


def _batches(shared_data, vocab_size: int, n: int, batch: int = 4, length: int = 32) -> list[torch.Tensor]:
    """Byte-level (B, T+1) windows of tinyshakespeare (ids = bytes, all < 256 <= vocab_size)."""
    data = torch.tensor(list((shared_data / "tinyshakespeare.txt").read_bytes()[:50_000]), dtype=torch.long)
    assert int(data.max()) < vocab_size
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(data) - length - 1, (n, batch), generator=g)
    return [torch.stack([data[s:s + length + 1] for s in row]) for row in starts]


@pytest.mark.parametrize("preset,overrides", [
    ("llama-tiny", dict(tie_embeddings=False, qkv_bias=True)),
    ("gpt2-tiny", dict()),
])
def test_trained_model_exports_with_identical_logits(shared_data, tmp_path, preset, overrides):
    config = get_preset(preset, vocab_size=256, d_model=64, n_layers=2, max_seq_len=64, **overrides)
    model = TransformerLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses = []
    batches = _batches(shared_data, config.vocab_size, n=8)
    for batch in batches:
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5  # it really trained

    directory = scratchlm.save_pretrained(model, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = batches[0][:, :-1]
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
