"""Toy end-to-end runs (seeded, CPU): SFT lowers assistant-token loss, DPO raises preference accuracy,
GRPO and PPO raise a verifiable reward above a briefly pretrained starting policy."""

from __future__ import annotations

import copy

import pytest
import torch

from scratchlm.align.dpo_trainer import DPOTrainConfig, preference_accuracy, train_dpo
from scratchlm.align.grpo import preset
from scratchlm.align.grpo_trainer import GRPOTrainConfig, train_grpo
from scratchlm.align.ppo_trainer import PPOTrainConfig, train_ppo
from scratchlm.align.sft_trainer import SFTTrainConfig, sft_eval_loss, train_sft
from scratchlm.align.toy_task import addition_prompts, byte_tokenizer, mean_reward, supervised_warmup, toy_model_config
from scratchlm.align.trainer_common import OptimConfig
from scratchlm.data.align_data import encode_completion, encode_prompt
from scratchlm.model import TransformerLM


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These models are tiny (~50k parameters): intra-op threads only add contention on a shared 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def toy(_one_thread):
    """Byte tokenizer, the 25 addition prompts, and a model pretrained briefly (120 steps) on correct sums."""
    torch.manual_seed(0)
    tok, ex = byte_tokenizer(), addition_prompts(4)
    model = TransformerLM(toy_model_config(tok.vocab_size))
    supervised_warmup(model, tok, ex, steps=120, p_correct=1.0, lr=1e-2, batch_size=32, seed=0)
    return tok, ex, model


def test_grpo_raises_reward(toy):
    tok, ex, warm = toy
    model = copy.deepcopy(warm)
    start = mean_reward(model, tok, ex, samples=16)
    cfg = GRPOTrainConfig(steps=80, prompts_per_step=8, group_size=8, max_new_tokens=4, seed=0,
                          loss=preset("grpo"), optim=OptimConfig(lr=3e-3, warmup_steps=10))
    history = train_grpo(model, tok, ex, cfg, progress=False)
    end = mean_reward(model, tok, ex, samples=16)
    assert 0.2 < start < 0.7  # a real but imperfect starting policy
    assert end > start + 0.1, (start, end)
    assert all(h["kl"] >= 0 for h in history) and history[-1]["kl"] > 0  # k3 >= 0 and the policy moved


def test_ppo_raises_reward(toy):
    tok, ex, warm = toy
    model = copy.deepcopy(warm)
    start = mean_reward(model, tok, ex, samples=16)
    cfg = PPOTrainConfig(steps=40, prompts_per_step=32, max_new_tokens=4, ppo_epochs=2, micro_batch=32,
                         kl_coef=0.01, optim=OptimConfig(lr=2e-3, warmup_steps=5))
    history, critic = train_ppo(model, tok, ex, cfg, progress=False)
    end = mean_reward(model, tok, ex, samples=16)
    assert end > start + 0.1, (start, end)
    assert history[-1]["value_loss"] < history[0]["value_loss"]  # the critic learned something


def _pairs(tok, ex):
    pairs = []
    for e in ex:
        right = e.fields["answer"]
        wrong = str((int(right) + 3) % 9)
        p = encode_prompt(tok, e.prompt)
        pairs.append((p, encode_completion(tok, e.prompt, right), encode_completion(tok, e.prompt, wrong)))
    return pairs


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_raises_preference_accuracy(toy, loss_type):
    tok, ex, _ = toy
    torch.manual_seed(1)
    model = TransformerLM(toy_model_config(tok.vocab_size))
    pairs = _pairs(tok, ex)
    start = preference_accuracy(model, pairs)
    cfg = DPOTrainConfig(steps=40, batch_size=16, beta=0.1, loss_type=loss_type, optim=OptimConfig(lr=3e-3))
    history = train_dpo(model, pairs, cfg, progress=False)
    end = preference_accuracy(model, pairs)
    assert end >= 0.95 and end >= start + 0.2, (start, end)
    assert history[-1]["rewards/margins"] > 0 and history[-1]["loss"] < history[0]["loss"]


def test_sft_lowers_assistant_token_loss(toy):
    tok, ex, _ = toy
    torch.manual_seed(2)
    model = TransformerLM(toy_model_config(tok.vocab_size))
    examples = []
    for e in ex:
        p, c = encode_prompt(tok, e.prompt), encode_completion(tok, e.prompt, e.fields["answer"])
        examples.append((p + c, [0] * len(p) + [1] * len(c)))
    start = sft_eval_loss(model, examples)
    train_sft(model, examples, SFTTrainConfig(steps=60, batch_size=16, optim=OptimConfig(lr=1e-2)), progress=False)
    end = sft_eval_loss(model, examples)
    assert end < 0.5 * start, (start, end)
    packed = SFTTrainConfig(steps=5, batch_size=4, pack=True, seq_len=16, optim=OptimConfig(lr=1e-3))
    assert len(train_sft(model, examples, packed, progress=False)) == 5
