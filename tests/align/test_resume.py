"""Every post-training trainer resumes bit-identically: N + M steps in one go == N steps, a kill, then
--resume for M steps (weights, optimizer moments, RNG, data position, reference/critic, history)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from scratchlm.align.run_state import AlignCheckpointer, CheckpointOptions
from scratchlm.align.dpo_trainer import DPOTrainConfig, train_dpo
from scratchlm.align.grpo import preset
from scratchlm.align.grpo_trainer import GRPOTrainConfig, train_grpo
from scratchlm.align.ppo_trainer import PPOTrainConfig, train_ppo
from scratchlm.align.sft_trainer import SFTTrainConfig, train_sft
from scratchlm.align.toy_task import addition_prompts, byte_tokenizer, supervised_warmup, toy_model_config
from scratchlm.align.trainer_common import OptimConfig
from scratchlm.model_files import load_model
from scratchlm.data.align_data import encode_completion, encode_prompt
from scratchlm.model import TransformerLM
from scratchlm.nn.lora import apply_lora

N, M = 2, 2


class Killed(Exception):
    pass


@contextlib.contextmanager
def killed_after_first_checkpoint():
    """Inside the block a run dies right after writing its checkpoint at step N (what a SIGKILL leaves)."""
    original = AlignCheckpointer.after_step

    def after_step(self, state, total):
        original(self, state, total)
        if state.step == N:
            raise Killed

    AlignCheckpointer.after_step = after_step
    try:
        with pytest.raises(Killed):
            yield
    finally:
        AlignCheckpointer.after_step = original


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Bit-identical comparisons need one torch thread; tiny models are fastest so anyway."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def toy(_one_thread):
    tok, ex = byte_tokenizer(), addition_prompts(2)
    torch.manual_seed(0)
    base = TransformerLM(toy_model_config(tok.vocab_size, d_model=32, n_layers=1))
    supervised_warmup(base, tok, ex, steps=25, p_correct=0.5, batch_size=16, lr=1e-2)  # rewards that vary
    return tok, ex, base


def _sft_data(tok, ex):
    out = []
    for e in ex:
        p, c = encode_prompt(tok, e.prompt), encode_completion(tok, e.prompt, e.fields["answer"])
        out.append((p + c, [0] * len(p) + [1] * len(c)))
    return out


def _pairs(tok, ex):
    return [(encode_prompt(tok, e.prompt), encode_completion(tok, e.prompt, e.fields["answer"]),
             encode_completion(tok, e.prompt, "9")) for e in ex]


def _runners(tok, ex, precision: str = "fp32", fast: bool = False):
    optim = OptimConfig(lr=1e-2, warmup_steps=1, schedule="cosine", precision=precision,
                        optimizer_impl="torch" if fast else "reference")
    steps = N + M
    sft = SFTTrainConfig(steps=steps, batch_size=4, micro_batch=2, optim=optim,
                         loss_impl="chunked" if fast else "reference")
    dpo = DPOTrainConfig(steps=steps, batch_size=3, optim=optim)
    grpo = GRPOTrainConfig(steps=steps, prompts_per_step=2, group_size=3, max_new_tokens=3, num_iterations=2,
                           micro_batch=4, loss=preset("grpo", beta=0.1), optim=optim)
    ppo = PPOTrainConfig(steps=steps, prompts_per_step=3, max_new_tokens=3, ppo_epochs=2, micro_batch=2,
                         optim=optim)
    return {
        "sft": lambda m, c: train_sft(m, _sft_data(tok, ex), sft, progress=False, checkpoint=c),
        "sft_lora": lambda m, c: train_sft(m, _sft_data(tok, ex), sft, progress=False, checkpoint=c),
        "dpo": lambda m, c: train_dpo(m, _pairs(tok, ex), dpo, progress=False, checkpoint=c),
        "grpo": lambda m, c: train_grpo(m, tok, ex, grpo, progress=False, checkpoint=c),
        "grpo_lora": lambda m, c: train_grpo(m, tok, ex, grpo, progress=False, checkpoint=c),
        "ppo": lambda m, c: train_ppo(m, tok, ex, ppo, progress=False, checkpoint=c)[0],
    }


def _fresh(base, lora: bool):
    model = copy.deepcopy(base).train()
    if lora:
        torch.manual_seed(3)
        apply_lora(model, ["q_proj", "v_proj", "down_proj"], r=2, alpha=4, dropout=0.25)
    return model


@pytest.mark.parametrize("trainer", ["sft", "sft_lora", "dpo", "grpo", "grpo_lora", "ppo"])
@pytest.mark.parametrize("numerics", ["fp32", "bf16-mixed+fast"])
def test_n_plus_m_equals_n_kill_resume_m(tmp_path, toy, trainer, numerics):
    """Also within bf16-mixed precision with the fast paths (fused AdamW, chunked SFT loss, activation
    checkpointing): the exact-resume guarantee holds for each precision on its own."""
    tok, ex, base = toy
    fast = numerics != "fp32"
    run = _runners(tok, ex, "bf16-mixed" if fast else "fp32", fast)[trainer]
    if fast:
        base = copy.deepcopy(base)
        base.activation_checkpointing = True
    lora = trainer.endswith("lora")
    whole = _fresh(base, lora)
    history = run(whole, CheckpointOptions(tmp_path / "a", every=N))

    killed = _fresh(base, lora)
    with killed_after_first_checkpoint():
        run(killed, CheckpointOptions(tmp_path / "b", every=N))
    if not lora:
        saved = load_model(tmp_path / "b" / "checkpoint")  # the checkpoint alone is a loadable model
        assert saved.config == base.config
    torch.manual_seed(12345)  # resume must not depend on the process's RNG state
    resumed = _fresh(base, lora)
    resumed_history = run(resumed, CheckpointOptions(tmp_path / "b", every=N, resume=True))
    assert len(resumed_history) == N + M
    assert resumed_history == history  # bit-identical metrics, step by step
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    start = _fresh(base, lora).state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # training changed something


def test_resume_refuses_other_settings_and_a_changed_base(tmp_path, toy):
    tok, ex, base = toy
    data = _sft_data(tok, ex)
    cfg = SFTTrainConfig(steps=N + M, batch_size=4, optim=OptimConfig(lr=1e-2))
    with killed_after_first_checkpoint():
        train_sft(copy.deepcopy(base), data, cfg, progress=False, checkpoint=CheckpointOptions(tmp_path, every=N))
    other = SFTTrainConfig(steps=N + M, batch_size=2, optim=OptimConfig(lr=1e-2))
    with pytest.raises(ValueError, match="batch_size"):
        train_sft(copy.deepcopy(base), data, other, progress=False,
                  checkpoint=CheckpointOptions(tmp_path, every=N, resume=True))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train_sft(copy.deepcopy(base), data, cfg, progress=False,
                  checkpoint=CheckpointOptions(tmp_path / "empty", every=N, resume=True))
    lora = _fresh(base, True)
    with killed_after_first_checkpoint():
        train_sft(lora, data, cfg, progress=False, checkpoint=CheckpointOptions(tmp_path / "lora", every=N))
    changed = copy.deepcopy(base)
    with torch.no_grad():
        changed.model.norm.weight += 1.0  # the starting checkpoint was edited since
    with pytest.raises(ValueError, match="sha256"):
        train_sft(_fresh(changed, True), data, cfg, progress=False,
                  checkpoint=CheckpointOptions(tmp_path / "lora", every=N, resume=True))
