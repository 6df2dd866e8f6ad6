"""Per-token log-probs, entropy and masked reductions vs torch; batched scoring vs one sequence at a time."""

from __future__ import annotations

import pytest
import torch

from scratchlm.align.logprobs import (completion_logprobs, entropy, masked_mean, masked_normalize, masked_sum,
                                      response_log_probs, sequence_logprobs, token_logprobs)
from scratchlm.align.prompt_output import prompt_output_tensors, tokenize_prompt_and_output
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
    assert masked_normalize(x, m, 8.0).item() == 0.5 and masked_normalize(x, m, 2.0, dim=1).tolist() == [2.0, 0.0]
    row = masked_mean(x, m, dim=1)  # a fully masked row follows torch: mean of nothing is NaN
    assert row[0].item() == 2.0 and torch.isnan(row[1]) and torch.isnan(torch.tensor([]).mean())
    assert torch.isnan(masked_mean(x, torch.zeros_like(m)))
    poisoned = x.clone()
    poisoned[0, 1] = float("inf")  # a masked-out slot is never read
    assert masked_mean(poisoned, m).item() == 2.0 and masked_sum(poisoned, m).item() == 4.0
    with pytest.raises(ValueError, match="normalize_constant"):
        masked_normalize(x, m, 0.0)


def test_tokenize_prompt_and_output_with_a_transformers_tokenizer(shared_data):
    from transformers import GPT2TokenizerFast

    tok = GPT2TokenizerFast(str(shared_data / "gpt2_vocab.json"), str(shared_data / "gpt2_merges.txt"))
    prompts, outputs = ["Hello, my name is", "2+2="], [" Bob.", "4 and more text"]
    t = tokenize_prompt_and_output(prompts, outputs, tok, pad_id=-1)
    for b, (p, o) in enumerate(zip(prompts, outputs)):
        pi, oi = tok(p)["input_ids"], tok(o)["input_ids"]
        full = pi + oi + [-1] * (t["input_ids"].shape[1] + 1 - len(pi) - len(oi))
        assert t["input_ids"][b].tolist() == full[:-1] and t["labels"][b].tolist() == full[1:]
        assert t["response_mask"][b].tolist() == [False] * (len(pi) - 1) + [True] * len(oi) + [False] * (
            len(full) - len(pi) - len(oi))
    with pytest.raises(ValueError, match="one output per prompt"):
        tokenize_prompt_and_output(["a"], [], tok)


def test_response_log_probs_of_a_transformers_model_and_ours():
    """The same helper scores an HF LlamaForCausalLM (output.logits) and our TransformerLM (a tensor)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from scratchlm.interop.hf.config_json import config_to_hf

    ours = TransformerLM(get_preset("llama-tiny", vocab_size=50, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                                    rope_style="half", tie_embeddings=False)).eval()
    hf = LlamaForCausalLM(LlamaConfig(**config_to_hf(ours.config, "llama"))).eval()
    hf.load_state_dict(ours.state_dict(), strict=True)
    t = prompt_output_tensors([[1, 2, 3], [4]], [[5, 6], [7, 8, 9, 10]])
    labels = t["labels"].masked_fill(~t["response_mask"], -100)
    with torch.no_grad():
        got_hf = response_log_probs(hf, t["input_ids"], labels, return_token_entropy=True)
        got = response_log_probs(ours, t["input_ids"], labels, return_token_entropy=True)
        lp = torch.log_softmax(hf(t["input_ids"]).logits.float(), -1)  # (B, T, V)
    expect = lp.gather(-1, t["labels"].unsqueeze(-1)).squeeze(-1) * t["response_mask"]
    ent = -(lp.exp() * lp).sum(-1)
    for out in (got_hf, got):
        torch.testing.assert_close(out["log_probs"], expect, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out["token_entropy"], ent, rtol=1e-5, atol=1e-5)
    assert bool((got["log_probs"][~t["response_mask"]] == 0).all())


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
