"""Per-token log-probs, entropy and masked reductions vs torch; batched scoring vs one sequence at a time."""

from __future__ import annotations

import pytest
import torch

from scratchlm.align.logprobs import (completion_logprobs, entropy, masked_mean, masked_sum, sequence_logprobs,
                                      token_logprobs)
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_token_logprobs_and_entropy_vs_torch(temperature):
    logits = torch.randn(3, 5, 11, dtype=torch.float64) * 4
    logits[0, 0, 3] = 1e4  # stability: a huge logit
    targets = torch.randint(0, 11, (3, 5))
    ref = torch.log_softmax(logits.float() / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets, temperature), ref, atol=1e-5)
    ent = torch.distributions.Categorical(logits=logits.float() / temperature).entropy()
    assert torch.allclose(entropy(logits, temperature), ent, atol=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, 0.0)


def test_masked_reductions_hand_worked():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert masked_sum(x, m).item() == 4.0
    assert masked_mean(x, m).item() == 2.0
    assert masked_mean(x, m, dim=1).tolist() == [2.0, 0.0]  # fully masked row -> 0, not NaN


def test_batched_completion_logprobs_equal_one_at_a_time():
    model = TransformerLM(get_preset("llama-tiny", vocab_size=50, n_layers=2, d_model=32, n_heads=4,
                                     n_kv_heads=2)).eval()
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    completions = [[10, 11], [12, 13, 14, 15], [16]]
    with torch.no_grad():
        logp, mask = completion_logprobs(model, prompts, completions, temperature=0.8)
        sums, counts = sequence_logprobs(model, prompts, completions, temperature=0.8)
        for b, (p, c) in enumerate(zip(prompts, completions)):
            ids = torch.tensor([p + c])
            lp = torch.log_softmax(model(ids)[0].float() / 0.8, -1)  # (T, V), torch's log-softmax
            expect = torch.stack([lp[len(p) + j - 1, t] for j, t in enumerate(c)])
            assert torch.allclose(logp[b, : len(c)], expect, atol=1e-5)
            assert torch.equal(logp[b, len(c):], torch.zeros(4 - len(c)))
            assert sums[b].item() == pytest.approx(expect.sum().item(), abs=1e-4)
    assert mask.sum(1).tolist() == [2.0, 4.0, 1.0] and counts.tolist() == [2.0, 4.0, 1.0]
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        completion_logprobs(model, [[]], [[1]])
