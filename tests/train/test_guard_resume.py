"""Divergence guard, keep_last, resume with a changed schedule, weights fingerprint, RNG on resume, MFU peak,
progress bar totals, and 2-thread determinism of training (each a regression test of issue #19)."""

import json
import math
import random
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from scratchlm.model_files import save_model
from scratchlm.model import TransformerLM
from scratchlm.nn.embedding import Embedding
from scratchlm.train import loop
from scratchlm.train import run_metrics as metrics
from scratchlm.train.checkpoint import load_config
from scratchlm.train.guard import DivergenceGuard, LastGood, TrainingDiverged, WeightStats
from scratchlm.train.loop import train
from scratchlm.train.run_metrics import PeakTracker
from scratchlm.train.train_config import TrainConfig
from scratchlm.train.progress import TrainProgress
from tests.train.conftest import tiny_config


def _records(run, key="loss"):
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in r}


def _state(run, name="checkpoint"):
    return json.loads((run / name / "trainer_state.json").read_text())


def test_guard_rule_on_numbers():
    g = DivergenceGuard(spike_factor=3.0)
    for loss in (4.0, 3.0, 2.5):
        g.check_step(0, loss, 1.0, 1e-3, None)
    avg = g.average
    expected = (0.9**2 * 0.1 * 4.0 + 0.9 * 0.1 * 3.0 + 0.1 * 2.5) / (1 - 0.9**3)  # bias-corrected EMA
    assert avg == pytest.approx(expected, rel=1e-12)
    assert not g.spike(3 * avg) and g.spike(3 * avg + 1e-6)
    small = DivergenceGuard(3.0, ema=0.1 * 0.05, n=1)  # average 0.05: 0.2 is 4x but not 1 nat above
    assert not small.spike(0.2) and small.spike(1.06)
    with pytest.raises(TrainingDiverged, match=r"loss=inf.*the last good checkpoint \(step 2\) in ckpt is intact"):
        g.check_step(3, math.inf, 1.0, 1e-3, LastGood("ckpt", 2))
    with pytest.raises(TrainingDiverged, match="some weights are inf/NaN.*no checkpoint was written yet"):
        g.check_before_save(4, False, 2.0, LastGood(None))
    assert DivergenceGuard(0.0, ema=0.4, n=1).spike(1e9) is False  # 0 = off


def test_weight_growth_rule_on_numbers():
    saved = WeightStats(norm=10.0, max_abs=2.0, step=4)
    assert WeightStats(30.0, 4.0, 6).growth_since(saved) == 3.0  # the larger of 30/10 and 4/2
    assert WeightStats(11.0, 500.0, 6).growth_since(saved) == 250.0  # one exploded weight shows in max |w|
    g = DivergenceGuard(3.0, weight_growth_factor=100.0)
    g.check_before_save(6, True, 2.0, LastGood("ckpt", 4), WeightStats(1000.0, 200.0, 6), saved)  # exactly 100x
    with pytest.raises(TrainingDiverged, match=r"step 6: the weights to save grew 100x since the weights saved at "
                                               r"step 4 .*last good checkpoint \(step 4\) in ckpt is intact"):
        g.check_before_save(6, True, 2.0, LastGood("ckpt", 4), WeightStats(1000.0, 200.1, 6), saved)
    with pytest.raises(TrainingDiverged, match="grew 1e\\+06x since the initial weights .*no checkpoint was written"):
        g.check_before_save(2, True, 2.0, LastGood(None), WeightStats(1e7, 1.0, 2), WeightStats(10.0, 1.0, 0))
    DivergenceGuard(3.0, weight_growth_factor=0.0).check_before_save(  # 0 = off
        2, True, 2.0, LastGood(None), WeightStats(1e7, 1.0, 2), WeightStats(10.0, 1.0, 0))
    with pytest.raises(ValueError, match="weight_growth_factor must be > 1"):
        TrainConfig(weight_growth_factor=0.5)


def test_resume_with_absurd_lr_keeps_the_good_checkpoint_and_names_its_step(tmp_path, tokens):
    """Issue #26: lr 1e9 after a resume moved the weights to ~1e9 while the probe loss stayed finite (every logit
    saturated: ln V), so step 3's blown-up weights replaced the good step-2 checkpoint."""
    cfg = tiny_config(tmp_path, max_steps=10, stop_at_step=2, ckpt_interval=1)
    train(cfg)
    run, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoint"
    good = (ckpt / "model.safetensors").read_bytes()
    absurd = cfg.with_overrides({"stop_at_step": 0, "lr": 1e9})
    with pytest.raises(TrainingDiverged, match=r"diverged at step 3: the weights to save grew .*x since the weights "
                                               r"saved at step 2 .*the last good checkpoint \(step 2\) in "
                                               r".*checkpoint is intact"):
        train(absurd, resume=True)
    assert (ckpt / "model.safetensors").read_bytes() == good and _state(run)["trainer"]["step"] == 2
    assert not any(p.name.startswith(".checkpoint") for p in run.iterdir())
    unguarded = absurd.with_overrides({"weight_growth_factor": 0, "max_steps": 3})  # what happened before
    train(unguarded, resume=True)
    assert _state(run)["trainer"]["step"] == 3
    assert max(float(w.abs().max()) for w in load_file(str(ckpt / "model.safetensors")).values()) > 1e6


def test_spike_stops_before_saving_over_the_good_checkpoint(tmp_path, tokens):
    cfg = tiny_config(tmp_path, max_steps=12, stop_at_step=4, ckpt_interval=1)
    train(cfg)
    ckpt = tmp_path / "run" / "checkpoint"
    good = (ckpt / "model.safetensors").read_bytes()
    # finite but absurd updates; the probe-loss rule alone (the weight-growth rule, 0 = off, would stop it too)
    blow = cfg.with_overrides({"stop_at_step": 0, "lr": 30.0, "min_lr": 0.0, "weight_growth_factor": 0})
    with pytest.raises(TrainingDiverged, match=r"diverged at step 5: the weights to save have probe loss .* "
                                               r"last good checkpoint \(step 4\) in .*checkpoint is intact"):
        train(blow, resume=True)
    assert (ckpt / "model.safetensors").read_bytes() == good and _state(tmp_path / "run")["trainer"]["step"] == 4
    unguarded = blow.with_overrides({"spike_factor": 0, "max_steps": 8})  # the old behaviour: saves garbage
    train(unguarded, resume=True)
    assert max(r["loss"] for r in _records(tmp_path / "run").values()) > 50


def test_non_finite_weights_are_never_saved(tmp_path, tokens, monkeypatch):
    cfg = tiny_config(tmp_path, max_steps=8, ckpt_interval=4)
    real_step = loop.Trainer.train_step

    def step_then_poison(self, step):
        out = real_step(self, step)
        if step == 7:  # the last update (step 8) leaves one inf weight; its loss was finite
            with torch.no_grad():
                self.raw_model.model.norm.weight[0] = math.inf
        return out

    monkeypatch.setattr(loop.Trainer, "train_step", step_then_poison)
    with pytest.raises(TrainingDiverged, match="step 8: some weights are inf/NaN"):
        train(cfg)
    assert _state(tmp_path / "run")["trainer"]["step"] == 4


def test_keep_last_keeps_older_checkpoints_and_prunes(tmp_path, tokens):
    run = tmp_path / "run"
    train(tiny_config(tmp_path, max_steps=10, ckpt_interval=2, keep_last=3))
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint")) == [
        "checkpoint", "checkpoint-6", "checkpoint-8"]
    for name, step in (("checkpoint", 10), ("checkpoint-8", 8), ("checkpoint-6", 6)):
        assert _state(run, name)["trainer"]["step"] == step
        load_config(run / name)
    assert not any(p.name.startswith(".checkpoint") for p in run.iterdir())
    with pytest.raises(ValueError, match="keep_last must be a positive integer"):
        tiny_config(tmp_path, keep_last=0)


def test_resume_with_more_steps_extends_the_schedule(tmp_path, tokens, capsys):
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, max_steps=6, ckpt_interval=3)
    train(cfg)
    longer = cfg.with_overrides({"max_steps": 10})
    result = train(longer, resume=True)
    assert result.step == 10  # was: the old schedule's 6 steps, exit 0, nothing trained
    assert "schedule changed (max_steps 6 -> 10); steps 7..10 follow the new cosine schedule" in capsys.readouterr().err
    lrs = {s: r["lr"] for s, r in _records(run).items()}
    for s in range(7, 11):  # lr(s) is cosine over 10 steps from step 7 on: warmup 3, floor min_lr
        p = (s - 1 - 3) / (10 - 3)
        assert lrs[s] == pytest.approx(1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + math.cos(math.pi * p)), rel=1e-12)
    with pytest.raises(ValueError, match="is at step 10 but max_steps=8; nothing would be trained"):
        train(longer.with_overrides({"max_steps": 8}), resume=True)
    train(longer, resume=True)  # a finished run, unchanged: nothing to do, says so
    assert "already at step 10 of 10; nothing to train" in capsys.readouterr().err


def test_resume_refuses_weights_replaced_since_the_checkpoint(tmp_path, tokens):
    cfg = tiny_config(tmp_path, max_steps=6, stop_at_step=3)
    train(cfg)
    ckpt = tmp_path / "run" / "checkpoint"
    other = TransformerLM(load_config(ckpt))  # what `convert` or a copy over model.safetensors leaves
    save_model(other, ckpt)
    with pytest.raises(ValueError, match=r"model.safetensors is not the file this checkpoint saved \(its SHA-256"):
        train(cfg.with_overrides({"stop_at_step": 0}), resume=True)


def test_resume_restores_rng_exactly_and_seeds_python_numpy(tmp_path, tokens):
    """The peak measurement (peak_gflops=0) no longer draws from the restored torch RNG."""
    full = tiny_config(tmp_path, out_dir=str(tmp_path / "full"), max_steps=6, peak_gflops=0.0, seed=7)
    train(full)
    part = full.with_overrides({"out_dir": str(tmp_path / "part"), "stop_at_step": 2})
    torch.manual_seed(123)  # whatever the process did before must not matter
    random.seed(5)
    np.random.seed(5)
    train(part)
    train(part.with_overrides({"stop_at_step": 0}), resume=True)
    a = load_file(str(tmp_path / "full" / "checkpoint" / "trainer_state.safetensors"))
    b = load_file(str(tmp_path / "part" / "checkpoint" / "trainer_state.safetensors"))
    assert torch.equal(a["rng.torch_cpu"], b["rng.torch_cpu"])
    rng_a, rng_b = _state(tmp_path / "full")["rng"], _state(tmp_path / "part")["rng"]
    assert rng_a == rng_b
    random.seed(7)
    np.random.seed(7)
    assert rng_a["python"][1] == list(random.getstate()[1])
    assert rng_a["numpy"][1] == np.random.get_state()[1].tolist()


def test_mfu_of_a_measured_peak_never_exceeds_one(monkeypatch):
    measured = iter([10.0, 12.0])
    monkeypatch.setattr(metrics, "measure_matmul_peak_gflops", lambda *a, **k: next(measured))
    tracker = PeakTracker(0.0, torch.float32, torch.device("cpu"))
    assert tracker.mfu(1000.0, 5e6) == pytest.approx(0.5)  # 5 GFLOP/s of 10
    assert tracker.mfu(4000.0, 5e6) == pytest.approx(1.0)  # 20 GFLOP/s: re-measured (12), raised to 20
    assert tracker.peak == 20.0
    assert PeakTracker(10.0, torch.float32, torch.device("cpu")).mfu(4000.0, 5e6) == pytest.approx(2.0)  # given


def test_time_budget_bar_counts_seconds_and_never_jumps(tmp_path, tokens, monkeypatch):
    """Issue #26: quickstart's bar showed an estimated step total (~2000, then ~58, then ~66). A time-budget bar
    shows only what is known: elapsed / budget seconds, the steps done (no total), loss and tok/s."""
    totals, shown = [], []

    class Recording(TrainProgress):
        def advance(self, step, total_steps, elapsed_s):
            super().advance(step, total_steps, elapsed_s)
            totals.append(self.bar.total)
            shown.append((step, total_steps, str(self.bar)))

    estimates = iter([58, 66])  # the sizes, independent of this machine's speed

    def fix_budget(self, steps_done, seconds):
        self.state.total_steps = next(estimates)

    monkeypatch.setattr(loop, "TrainProgress", Recording)
    monkeypatch.setattr(loop.Trainer, "_fix_budget", fix_budget)
    result = train(tiny_config(tmp_path, max_steps=2000, warmup_steps=3, max_time_s=600.0, eval_interval=1000,
                               ckpt_interval=1000, log_interval=10, progress=True))
    assert result.step == 66 and set(totals) == {600}  # re-sized at 25 and 50 steps; the bar was not
    assert [t for _, t, _ in shown][::25] == [2000, 58, 66]  # the estimate moved as in the issue
    for step, _, text in shown:
        assert re.search(r"\b\d+/600s\b", text) and f"step={step}" in text, text  # elapsed/budget, steps done
        assert "~" not in text and not re.search(rf"step={step}/", text), text  # no estimated total
    assert "tok_s=" in shown[-1][2] and "loss=" in shown[-1][2]
    steps = TrainProgress(120, 0, None, enabled=False)
    steps.advance(1, 120, 0.1)
    assert steps.bar.total == 120


def test_embedding_backward_is_deterministic_with_two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        emb = Embedding(64, 64)
        ids = torch.randint(0, 64, (8, 64))
        g = torch.randn(8, 64, 64) * torch.exp(torch.randn(8, 64, 64) * 3)  # wide magnitudes: order shows
        grads = []
        for _ in range(20):
            emb.weight.grad = None
            emb(ids).backward(g)
            grads.append(emb.weight.grad.clone())
        assert all(torch.equal(grads[0], x) for x in grads)
        expected = torch.zeros(64, 64, dtype=torch.float64).index_add_(0, ids.reshape(-1), g.reshape(-1, 64).double())
        torch.testing.assert_close(grads[0].double(), expected, rtol=1e-5, atol=1e-3)
    finally:
        torch.set_num_threads(before)


def test_two_thread_resume_is_bit_identical(tmp_path, tokens):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        extra = {"model.attn_impl": "sdpa", "model.ops_impl": "fused", "optimizer_impl": "torch", "loss_impl": "torch"}
        full = tiny_config(tmp_path, out_dir=str(tmp_path / "full"), max_steps=4, eval_interval=4, **extra)
        train(full)
        part = full.with_overrides({"out_dir": str(tmp_path / "part"), "stop_at_step": 2})
        train(part)
        train(part.with_overrides({"stop_at_step": 0}), resume=True)
        assert {s: r["loss"] for s, r in _records(tmp_path / "full").items()} == {
            s: r["loss"] for s, r in _records(tmp_path / "part").items()}
        a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
        b = load_file(str(tmp_path / "part" / "checkpoint" / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a)
    finally:
        torch.set_num_threads(before)
