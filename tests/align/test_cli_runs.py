"""Post-training runs on the command line: the output is published in one swap, the base model is never
overwritten, LoRA writes a PEFT adapter (or a merged checkpoint), and a SIGKILL at any moment leaves a
loadable checkpoint from which --resume finishes with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scratchlm.align import trainer_common
from scratchlm.align.toy_task import byte_tokenizer, toy_model_config
from scratchlm.model_files import load_model, save_model
from scratchlm.cli.main import main
from scratchlm.interop.hf.peft_adapter import load_adapter
from scratchlm.model import TransformerLM

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    save_model(TransformerLM(toy_model_config(259, d_model=32, n_layers=1)), d)
    byte_tokenizer().save(d)
    return d


def _chat(tmp_path: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"{a}+1"}, {"role": "assistant", "content": str(a + 1)}]}
            for a in range(6)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sft(base, data, out, *extra) -> int:
    return main(["sft", "--checkpoint", str(base), "--data", str(data), "--out", str(out), "--steps", "4",
                 "--lr", "1e-2", "--batch-size", "3", "--threads", "1", *extra])


def test_out_equal_to_checkpoint_never_overwrites_the_base(base, tmp_path, capsys):
    before = (base / "model.safetensors").read_bytes()
    for out in (base, base / "sub"):
        assert _sft(base, _chat(tmp_path), out) == 2
        err = capsys.readouterr().err
        assert "the starting --checkpoint" in err and "Traceback" not in err
    assert (base / "model.safetensors").read_bytes() == before and not (base / "sub").exists()


def test_existing_out_needs_overwrite_and_publish_is_one_swap(base, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _sft(base, _chat(tmp_path), out) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"

    def broken_save_run(*args, **kwargs):  # the process dies while the final directory is being written
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_common, "save_run", broken_save_run)
    monkeypatch.setattr("scratchlm.cli.align_common.save_run", broken_save_run)
    assert _sft(base, _chat(tmp_path), out, "--overwrite", "--checkpoint-every", "2") == 130  # "interrupted"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]  # no new weights beside anything old
    assert not list(tmp_path.glob(".o.*.tmp"))  # the half-written directory is gone
    monkeypatch.undo()
    assert _sft(base, _chat(tmp_path), out, "--overwrite") == 0
    names = sorted(p.name for p in out.iterdir())
    assert "keep.txt" not in names and "checkpoint" not in names and "model.safetensors" in names
    assert not list(tmp_path.glob(".o.*"))  # the moved-aside old contents are deleted after success


def test_lora_writes_a_peft_adapter_or_a_merged_checkpoint(base, tmp_path, capsys):
    lora = ["--lora-r", "4", "--lora-targets", "q_proj,v_proj,up_proj", "--seed", "3"]
    assert _sft(base, _chat(tmp_path), tmp_path / "a", *lora) == 0
    assert _sft(base, _chat(tmp_path), tmp_path / "m", *lora, "--merge") == 0
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and sorted(cfg["target_modules"]) == ["q_proj", "up_proj",
                                                                                         "v_proj"]
    assert cfg["base_model_name_or_path"] == str(base.resolve()) and not (tmp_path / "a" / "model.safetensors").exists()
    weights = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight" in weights
    adapted = load_adapter(load_model(base), tmp_path / "a").eval()
    merged = load_model(tmp_path / "m").eval()
    ids = torch.randint(0, 259, (2, 7))
    with torch.no_grad():
        assert (adapted(ids) - merged(ids)).abs().max() < 1e-5  # same run, two export forms
        assert (merged(ids) - load_model(base)(ids)).abs().max() > 1e-4  # the adapter learned something
    assert main(["sft", "--checkpoint", str(base), "--data", str(_chat(tmp_path)), "--out", str(tmp_path / "x"),
                 "--merge"]) == 2
    assert "--merge" in capsys.readouterr().err


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))


def _grpo(base: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scratchlm.cli.main", "grpo", "--checkpoint", str(base), "--data", str(data),
            "--out", str(out), "--reward", "exact_match", "--steps", "16", "--max-new-tokens", "3",
            "--prompts-per-step", "2", "--group-size", "3", "--beta", "0.05", "--lr", "1e-2", "--threads", "1",
            "--checkpoint-every", "1", *extra]


def _checkpoint_step(out: Path) -> int:
    for name in ("checkpoint", ".checkpoint.old"):
        try:
            return json.loads((out / name / "trainer_state.json").read_text())["step"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            continue
    return 0


def test_sigkill_leaves_a_loadable_checkpoint_and_resume_is_exact(base, tmp_path):
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(5)))
    ref = subprocess.Popen(_grpo(base, data, tmp_path / "ref"), env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    victim = subprocess.Popen(_grpo(base, data, tmp_path / "run"), env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while _checkpoint_step(tmp_path / "run") < 4 and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, victim.stderr.read().decode()[-2000:]
    k = _checkpoint_step(tmp_path / "run")
    assert 4 <= k < 16
    ckpt = next(p for p in (tmp_path / "run" / "checkpoint", tmp_path / "run" / ".checkpoint.old")
                if (p / "trainer_state.json").exists())
    load_model(ckpt)  # loadable as it was left
    resumed = subprocess.run(_grpo(base, data, tmp_path / "run", "--resume"), env=_env(), capture_output=True,
                             text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert ref.wait() == 0, ref.stderr.read().decode()[-2000:]
    a = load_file(str(tmp_path / "ref" / "model.safetensors"))
    b = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch.equal(a[n], b[n]) for n in a)
    history = [(tmp_path / d / "align_history.jsonl").read_text() for d in ("ref", "run")]
    assert history[0] == history[1] and len(history[0].splitlines()) == 16


def test_dpo_and_grpo_with_lora_write_adapters(base, tmp_path, capsys):
    prefs = tmp_path / "p.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": f"{a}=", "chosen": "yes", "rejected": "no"}) + "\n"
                             for a in range(4)))
    rc = main(["dpo", "--checkpoint", str(base), "--data", str(prefs), "--out", str(tmp_path / "d"), "--steps", "8",
               "--lr", "5e-2", "--lora-r", "4", "--lora-targets", "q_proj,v_proj,up_proj,down_proj", "--threads", "1"])
    assert rc == 0, capsys.readouterr().err
    history = [json.loads(line) for line in (tmp_path / "d" / "align_history.jsonl").read_text().splitlines()]
    assert history[-1]["rewards/margins"] > 0 and history[-1]["loss"] < history[0]["loss"]
    rl = tmp_path / "rl.jsonl"
    rl.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(3)))
    rc = main(["grpo", "--checkpoint", str(base), "--data", str(rl), "--out", str(tmp_path / "g"), "--steps", "2",
               "--reward", "exact_match", "--max-new-tokens", "3", "--prompts-per-step", "2", "--group-size", "2",
               "--lora-r", "2", "--threads", "1"])
    assert rc == 0, capsys.readouterr().err
    for d in ("d", "g"):
        assert (tmp_path / d / "adapter_model.safetensors").is_file()
        assert json.loads((tmp_path / d / "align_config.json").read_text())["lora"]["r"] in (2, 4)
