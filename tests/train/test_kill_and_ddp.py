"""Subprocess runs: SIGKILL mid-run then --resume is exact; DDP on 2 CPU processes equals 1 process."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scratchlm.train.loop import train
from tests.train.conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    return env


def _cli(config_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scratchlm.cli.main", "train", "--config", str(config_path), *extra]


def _records(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "loss" in r}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoint" / "model.safetensors"))


def _checkpoint_step(run_dir: Path) -> int:
    for name in ("checkpoint", ".checkpoint.old"):
        path = run_dir / name / "trainer_state.json"
        try:
            return json.loads(path.read_text())["trainer"]["step"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            continue
    return 0


def test_sigkill_mid_run_then_resume_is_exact(tmp_path, tokens):
    cfg = tiny_config(tmp_path, max_steps=100_000, ckpt_interval=3, eval_interval=10_000, num_threads=1)
    config_path = tmp_path / "cfg.json"
    config_path.write_text(json.dumps(cfg.to_dict()))
    victim = subprocess.Popen(_cli(config_path), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while _checkpoint_step(tmp_path / "run") < 9 and victim.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, victim.stderr.read().decode()[-2000:]
    k = _checkpoint_step(tmp_path / "run")
    assert k >= 9 and k % 3 == 0
    stop = k + 4
    ref = subprocess.Popen(_cli(config_path, f"--out_dir={tmp_path / 'ref'}", f"--stop_at_step={stop}"), env=_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    resumed = subprocess.run(_cli(config_path, "--resume", f"--stop_at_step={stop}"), env=_env(),
                             capture_output=True, text=True)
    assert ref.wait() == 0, ref.stderr.read().decode()[-2000:]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, want = _records(tmp_path / "run"), _records(tmp_path / "ref")
    assert sorted(got) == list(range(1, stop + 1))
    assert [got[s]["loss"] for s in got] == [want[s]["loss"] for s in got]  # bit-identical floats
    a, b = _weights(tmp_path / "run"), _weights(tmp_path / "ref")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_two_processes_equal_one_process_on_the_full_batch(tmp_path, tokens):
    """DDP on 2 CPU ranks x batch 2 vs 1 process x 2 micro-batches of 2 (FSDP2: the test below)."""
    common = dict(max_steps=4, warmup_steps=1, batch_size=2, eval_interval=4, ckpt_interval=4, num_threads=1)
    ddp = tiny_config(tmp_path, out_dir=str(tmp_path / "ddp"), **common)
    config_path = tmp_path / "ddp.json"
    config_path.write_text(json.dumps(ddp.to_dict()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "scratchlm.cli.main", "train", "--config", str(config_path)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one process, 2 micro-batches of 2 = the same 4 windows per step (see train/data_source.py)
    single = train(tiny_config(tmp_path, out_dir=str(tmp_path / "single"), grad_accum=2, **common))
    _assert_same_training(tmp_path / "ddp", tmp_path / "single", 4)
    assert single.val_loss is not None


def _assert_same_training(ranks: Path, one: Path, steps: int) -> None:
    """A 2-rank run equals the one-process run of the same windows (fp32 summation order aside)."""
    got, want = _records(ranks), _records(one)
    assert sorted(got) == sorted(want) == list(range(1, steps + 1))
    for s in got:
        assert abs(got[s]["loss"] - want[s]["loss"]) <= 1e-5 * want[s]["loss"], s
        assert abs(got[s]["grad_norm"] - want[s]["grad_norm"]) <= 1e-4 * want[s]["grad_norm"], s
    assert got[steps]["tokens"] == want[steps]["tokens"] == steps * 4 * 16
    a, b = _weights(ranks), _weights(one)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-4, atol=1e-5, msg=n)


def _torchrun(config_path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "scratchlm.cli.main", "train", "--config", str(config_path), *extra]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)


def test_fsdp_equals_one_process_resumes_exactly_and_its_checkpoint_resumes_in_one_process(tmp_path, tokens):
    """FSDP2 fully_shard on gloo, 2 ranks x batch 2: 6 steps == 1 process x 2 micro-batches of 2; 3 steps, save
    (moments gathered), --resume to 6 == the 6 uninterrupted FSDP steps; the FSDP checkpoint also resumes in a
    plain single process (same unsharded layout)."""
    common = dict(max_steps=6, warmup_steps=1, batch_size=2, eval_interval=3, ckpt_interval=3, num_threads=1,
                  fsdp=True)
    cfg = tiny_config(tmp_path, out_dir=str(tmp_path / "resumed"), **common)
    config_path = tmp_path / "fsdp.json"
    config_path.write_text(json.dumps(cfg.to_dict()))
    first = _torchrun(config_path, "--stop_at_step=3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert _checkpoint_step(tmp_path / "resumed") == 3
    saved = json.loads((tmp_path / "resumed" / "checkpoint" / "trainer_state.json").read_text())
    assert saved["optimizer"] is not None  # the sharded moments were gathered and saved
    one = tmp_path / "one"  # a copy of the step-3 FSDP checkpoint, resumed in one process below
    shutil.copytree(tmp_path / "resumed" / "checkpoint", one / "checkpoint")
    shutil.copy(tmp_path / "resumed" / "metrics.jsonl", one / "metrics.jsonl")
    second = _torchrun(config_path, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    straight = _torchrun(config_path, f"--out_dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    got, want = _records(tmp_path / "resumed"), _records(tmp_path / "straight")
    assert sorted(got) == sorted(want) == list(range(1, 7))
    assert [got[s]["loss"] for s in got] == [want[s]["loss"] for s in got]  # bit-identical floats
    a, b = _weights(tmp_path / "resumed"), _weights(tmp_path / "straight")
    assert all(torch.equal(a[n], b[n]) for n in a)
    # the uninterrupted FSDP run equals one process on the full batch (2 micro-batches = the same 4 windows)
    train(tiny_config(tmp_path, out_dir=str(tmp_path / "single"), grad_accum=2, **{**common, "fsdp": False}))
    _assert_same_training(tmp_path / "straight", tmp_path / "single", 6)
    # the step-3 FSDP checkpoint continues in one process (2 micro-batches = the same 4 windows per step)
    single = tiny_config(tmp_path, out_dir=str(one), grad_accum=2, **{**common, "fsdp": False})
    train(single, resume=True)
    got1 = _records(one)
    for s in range(4, 7):
        assert abs(got1[s]["loss"] - want[s]["loss"]) <= 1e-5 * want[s]["loss"], s
