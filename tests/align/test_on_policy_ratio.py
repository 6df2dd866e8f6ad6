"""With one policy update per rollout batch (num_iterations = 1) the importance ratio is exactly 1 and nothing is
clipped: GRPO's token ratio and GSPO's sequence ratio inside its 3e-4 / 4e-4 band alike (issue #26). The "old"
log-probs are the training forward's own (detached), and with num_iterations > 1 they come from the same
forward run without gradients (score_rollout), bit for bit: never from another numeric path such as the
decode kernels that sample, which would put nearly every GSPO sequence outside its band."""

from __future__ import annotations

import pytest
import torch

from scratchlm.align import grpo as grpo_module
from scratchlm.align.grpo import preset
from scratchlm.align.grpo_trainer import GRPOTrainConfig, train_grpo
from scratchlm.align.toy_task import byte_tokenizer, toy_model_config
from scratchlm.align.trainer_common import OptimConfig
from scratchlm.data.align_data import RLPrompt
from scratchlm.model import TransformerLM


def _spy_ratios(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Record the metadata (ratio, clip flags) of every policy-gradient loss the trainer computes."""
    seen: list[dict[str, torch.Tensor]] = []
    real = grpo_module.policy_gradient_loss

    def spy(*args, **kwargs):
        per_token, meta = real(*args, **kwargs)
        seen.append({k: v.detach().clone() for k, v in meta.items()})
        return per_token, meta

    monkeypatch.setattr(grpo_module, "policy_gradient_loss", spy)
    return seen


def _train(name: str, num_iterations: int, steps: int = 6):
    """A random small model; the reward (first character ASCII, about half of random bytes) gives every group
    mixed rewards, so each step has a learning signal and moves the policy."""
    torch.manual_seed(0)
    tok = byte_tokenizer()
    ex = [RLPrompt(f"{a}+{b}=", "regex_match", {"pattern": r"(?s)[\x00-\x7f].*"}) for a in range(3) for b in range(3)]
    model = TransformerLM(toy_model_config(tok.vocab_size, d_model=32, n_layers=1))
    cfg = GRPOTrainConfig(steps=steps, prompts_per_step=4, group_size=4, max_new_tokens=3, seed=0,
                          num_iterations=num_iterations, loss=preset(name), optim=OptimConfig(lr=1e-2))
    return train_grpo(model, tok, ex, cfg, progress=False)


@pytest.mark.parametrize("name", ["grpo", "gspo", "dapo"])
def test_one_update_per_batch_has_ratio_exactly_one_and_clips_nothing(name, monkeypatch):
    seen = _spy_ratios(monkeypatch)
    history = _train(name, num_iterations=1)
    assert len(seen) == len(history) == 6  # one micro-batch, one pass per step
    for meta in seen:
        assert torch.equal(meta["ratio"], torch.ones_like(meta["ratio"]))  # exactly 1, not within a tolerance
        assert not meta["clip_low"].any() and not meta["clip_high"].any()
    assert seen[0]["ratio"].shape[1] == (1 if name == "gspo" else seen[0]["ratio"].shape[1])  # GSPO: (B, 1)
    assert all(h["clip_low_frac"] == 0.0 and h["clip_high_frac"] == 0.0 for h in history)
    assert all(h["grad_norm"] > 0 for h in history)  # every step had a learning signal: the policy moved


def test_scored_old_logprobs_equal_the_training_forward_and_later_passes_clip(monkeypatch):
    """num_iterations = 2: the first pass's ratio against score_rollout's log-probs is exactly 1 (same forward,
    bitwise); the second pass, after an update, moves GSPO's sequence ratios out of the tiny band (so the
    metric above is not a constant)."""
    seen = _spy_ratios(monkeypatch)
    history = _train("gspo", num_iterations=2)
    first, second = seen[0::2], seen[1::2]
    assert len(first) == len(second) == len(history) == 6
    for meta in first:
        assert torch.equal(meta["ratio"], torch.ones_like(meta["ratio"]))
        assert not (meta["clip_low"].any() or meta["clip_high"].any())
    assert any(not torch.equal(m["ratio"], torch.ones_like(m["ratio"])) for m in second)
    assert any(h["clip_low_frac"] + h["clip_high_frac"] > 0 for h in history)  # last pass's metrics
