"""The training loop end to end on a tiny model: loss falls, exact resume, divergence, bad input."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from scratchlm.model_files import load_model
from scratchlm.train import loop
from scratchlm.train.loop import TrainingDiverged, train
from tests.train.conftest import make_tokens, tiny_config


def _losses(run_dir) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_loss_falls_and_outputs_are_written(tmp_path, tokens):
    cfg = tiny_config(tmp_path, max_steps=30, eval_interval=15, ckpt_interval=15)
    result = train(cfg)
    losses = _losses(tmp_path / "run")
    assert sorted(losses) == list(range(1, 31))
    assert losses[1] > 3.5 and sum(losses[i] for i in range(26, 31)) / 5 < 0.7 * losses[1]
    assert result.val_loss is not None and result.val_loss < 0.75 * math.log(64)
    model = load_model(result.checkpoint)
    assert model.config.vocab_size == 64 and model.config.d_model == 32
    assert (tmp_path / "run" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra", [
    {},
    {"sampler": "sequential", "grad_accum": 2, "optimizer_impl": "torch", "loss_impl": "torch", "dtype": "bf16"},
])
def test_resume_is_bit_identical(tmp_path, tokens, extra):
    full = tiny_config(tmp_path, out_dir=str(tmp_path / "full"), max_steps=12, **extra)
    train(full)
    part = tiny_config(tmp_path, out_dir=str(tmp_path / "part"), max_steps=12, stop_at_step=5, **extra)
    train(part)
    assert max(_losses(tmp_path / "part")) == 5
    train(part.with_overrides({"stop_at_step": 0}), resume=True)
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full")  # exact float equality, steps 1..12
    a = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path, tokens, monkeypatch):
    cfg = tiny_config(tmp_path, max_steps=12, ckpt_interval=4)
    real = loop.cross_entropy
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        out = real(*args, **kwargs)
        return out * float("nan") if calls["n"] == 8 else out  # forward of step 7 (+ the probe before step 4's save)

    monkeypatch.setattr(loop, "cross_entropy", poisoned)
    with pytest.raises(TrainingDiverged, match="diverged at step 7.*last good checkpoint"):
        train(cfg)
    ckpt = tmp_path / "run" / "checkpoint"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["trainer"]["step"] == 4
    monkeypatch.setattr(loop, "cross_entropy", real)
    result = train(cfg, resume=True)  # the intact checkpoint resumes
    assert result.step == 12


def test_bad_input_is_a_clear_error_and_overwrites_nothing(tmp_path, tokens):
    make_tokens(tmp_path / "short.bin", n=16)
    with pytest.raises(ValueError, match="needs at least 17"):
        train(tiny_config(tmp_path, train_data=str(tmp_path / "short.bin")))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(tiny_config(tmp_path, train_data=str(tmp_path / "missing.bin")))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(tiny_config(tmp_path), resume=True)
    cfg = tiny_config(tmp_path, max_steps=4)
    train(cfg)
    weights = tmp_path / "run" / "checkpoint" / "model.safetensors"
    snapshot = weights.read_bytes()
    with pytest.raises(FileExistsError, match="already holds a checkpoint at step 4; pass --resume"):
        train(cfg)
    with pytest.raises(ValueError, match=r"model config differs.*'d_model': \(32, 48\)"):
        train(cfg.with_overrides({"model.d_model": 48, "max_steps": 8}), resume=True)
    with pytest.raises(ValueError, match="seq_len=32 exceeds the model's max_seq_len=16"):
        train(tiny_config(tmp_path, seq_len=32, out_dir=str(tmp_path / "other")))
    state = tmp_path / "run" / "checkpoint" / "trainer_state.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated"):
        train(cfg.with_overrides({"max_steps": 8}), resume=True)
    (tmp_path / "run" / "checkpoint" / "trainer_state.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a scratchlm trainer state"):
        train(cfg.with_overrides({"max_steps": 8}), resume=True)
    assert weights.read_bytes() == snapshot


def test_crash_between_checkpoint_renames_resumes_from_the_old_copy(tmp_path, tokens):
    cfg = tiny_config(tmp_path, max_steps=8, stop_at_step=4)
    train(cfg)
    run = tmp_path / "run"
    (run / "checkpoint").rename(run / ".checkpoint.old")  # the state a crash after the first rename leaves
    (run / ".checkpoint.tmp").mkdir()  # and a half-written new checkpoint
    result = train(cfg.with_overrides({"stop_at_step": 0}), resume=True)
    assert result.step == 8 and (run / "checkpoint" / "trainer_state.json").exists()
    assert not (run / ".checkpoint.old").exists() and not (run / ".checkpoint.tmp").exists()


def test_compiled_training_matches_eager(tmp_path, tokens):
    """compile=true (torch.compile of the model, fused ops path) trains the same as eager (losses 1e-4)."""
    kw = {"max_steps": 4, "eval_interval": 4, "ckpt_interval": 4, "model.ops_impl": "fused", "model.attn_impl": "sdpa"}
    train(tiny_config(tmp_path, out_dir=str(tmp_path / "eager"), **kw))
    train(tiny_config(tmp_path, out_dir=str(tmp_path / "compiled"), compile=True, **kw))
    eager, compiled = _losses(tmp_path / "eager"), _losses(tmp_path / "compiled")
    assert sorted(compiled) == [1, 2, 3, 4]
    for s in eager:
        assert abs(compiled[s] - eager[s]) <= 1e-4 * eager[s], (s, compiled[s], eager[s])
    weights = load_file(str(tmp_path / "compiled" / "checkpoint" / "model.safetensors"))
    assert not any(k.startswith("_orig_mod") for k in weights)  # saved under the model's own names
