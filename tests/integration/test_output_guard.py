"""The output guard (scratchlm.io_utils), one-line errors (scratchlm.cli.main), strict booleans, `python -m`."""

import os
import subprocess
import sys

import pytest

from scratchlm import io_utils
from scratchlm.cli import main as cli_main
from scratchlm.cli.main import error_message, main
from scratchlm.config import ModelConfig
from scratchlm.field_types import parse_bool
from scratchlm.io_utils import (
    atomic_output_dir, atomic_output_file, check_output_path, claim_run_dir, release_replaced,
)
from scratchlm.train.train_config import TrainConfig, parse_cli_overrides


def test_check_output_path_refuses_what_it_did_not_create(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("keep")
    (tmp_path / "empty").mkdir()
    assert check_output_path(tmp_path / "new" / "deeper", "dir") == tmp_path / "new" / "deeper"
    assert check_output_path(tmp_path / "empty", "dir") == tmp_path / "empty"
    with pytest.raises(NotADirectoryError, match=r"afile is a file, not a directory"):
        check_output_path(tmp_path / "afile" / "tok", "dir")
    with pytest.raises(NotADirectoryError, match="is a file, but a directory is written there"):
        check_output_path(tmp_path / "afile", "dir", overwrite=True)
    with pytest.raises(IsADirectoryError, match="is a directory, but a file is written there"):
        check_output_path(tmp_path / "empty", "file", overwrite=True)
    with pytest.raises(FileExistsError, match=r"already holds 1 entry \(keep.txt\); pass --overwrite"):
        check_output_path(tmp_path / "full", "dir")
    with pytest.raises(FileExistsError, match="already holds a file of 1 bytes"):
        check_output_path(tmp_path / "afile", "file", flag="--metrics")
    assert check_output_path(tmp_path / "full", "dir", overwrite=True)


@pytest.mark.parametrize("exchange", [True, False])
def test_atomic_output_dir_swaps_in_whole_or_not_at_all(tmp_path, monkeypatch, exchange):
    if not exchange:  # the two-rename fallback (non-Linux)
        monkeypatch.setattr(io_utils, "exchange_paths", lambda a, b: False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(FileExistsError):
        with atomic_output_dir(out):
            pass
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_output_dir(out, overwrite=True) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp dir left behind
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    with atomic_output_dir(out, overwrite=True) as tmp:
        assert tmp.parent == out.parent and tmp != out
        (tmp / "new.txt").write_text("new")
        assert (out / "old.txt").read_text() == "old"  # untouched until the swap
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_output_file_and_run_dir(tmp_path):
    with atomic_output_file(tmp_path / "a.bin") as f:
        f.write(b"1")
    with pytest.raises(FileExistsError):
        with atomic_output_file(tmp_path / "a.bin") as f:
            f.write(b"2")
    assert (tmp_path / "a.bin").read_bytes() == b"1"
    run = tmp_path / "run"
    assert claim_run_dir(run) is None and not run.exists()  # created by the run's first write
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError):
        claim_run_dir(run)
    replaced = claim_run_dir(run, overwrite=True)
    assert (replaced / "metrics.jsonl").exists() and not run.exists()
    release_replaced(replaced)
    assert not replaced.exists()


def test_error_messages_are_one_line_with_path_and_hint():
    assert error_message(NotADirectoryError(20, "Not a directory", "a/b")) == (
        "a/b: Not a directory; a part of the path is a file, not a directory")
    assert error_message(PermissionError(13, "Permission denied", "/x")) == (
        "/x: Permission denied; choose a path you may write or fix its permissions")
    assert error_message(OSError(28, "No space left on device", "f")) == "f: No space left on device; free some disk space"
    assert error_message(KeyError("dtype")) == "missing key 'dtype'"
    assert error_message(ValueError("line one\n  line two")) == "line one line two"


@pytest.mark.parametrize("exc, code, text", [
    (PermissionError(13, "Permission denied", "/root/x"), 2, "scratchlm presets: error: /root/x: Permission denied"),
    (IsADirectoryError(21, "Is a directory", "d"), 2, "scratchlm presets: error: d: Is a directory"),
    (KeyboardInterrupt(), 130, "scratchlm presets: interrupted"),
    (ZeroDivisionError("division by zero"), 1, "scratchlm presets: internal error: ZeroDivisionError: division by zero"),
])
def test_main_turns_exceptions_into_one_line(monkeypatch, capsys, exc, code, text):
    monkeypatch.delenv("SCRATCHLM_TRACEBACK", raising=False)

    def boom(args):
        raise exc

    import scratchlm.cli.model_info as model_info
    monkeypatch.setattr(model_info, "run_presets", boom)
    assert main(["presets"]) == code
    err = capsys.readouterr().err
    assert err.startswith(text) and err.count("\n") == 1


def test_argparse_errors_are_one_line_naming_the_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        main(["tokenizer", "train", "--input", "x", "--vocab-size", "many", "--out", "o"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("scratchlm tokenizer train: error: argument --vocab-size: invalid int value: 'many'")
    assert err.count("\n") == 1


def test_strict_booleans():
    for raw, value in [("true", True), ("False", False), ("no", False), ("off", False), ("1", True), (0, False)]:
        assert parse_bool(raw, "x") is value
    assert TrainConfig(compile="no").compile is False and TrainConfig(progress="off").progress is False
    for bad in ("maybe", 2, "", None):
        with pytest.raises(ValueError, match="TrainConfig.compile must be true or false"):
            TrainConfig(compile=bad)
    with pytest.raises(ValueError, match="ModelConfig.tie_embeddings must be true or false, got 'maybe'"):
        ModelConfig(tie_embeddings="maybe")
    with pytest.raises(ValueError, match="TrainConfig.lr must be a number, got 'fast'"):
        TrainConfig().with_overrides(parse_cli_overrides(["--lr=fast"]))
    with pytest.raises(ValueError, match=r"ModelConfig.norm_eps must be a number, got 'x'"):
        ModelConfig(norm_eps="x")
    with pytest.raises(ValueError, match=r"TrainConfig.batch_size must be an integer, got 2.5"):
        TrainConfig(batch_size=2.5)


def test_python_dash_m_is_the_console_script():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "scratchlm", "presets"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.startswith("gpt2-small")
    bad = subprocess.run([sys.executable, "-m", "scratchlm", "train", "--preset", "smoke", "--lr=fast"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert bad.stderr == "scratchlm train: error: TrainConfig.lr must be a number, got 'fast'\n"
    assert cli_main.build_parser().prog == "scratchlm"


def test_overwrite_replaces_outputs_through_the_cli(tmp_path, monkeypatch, capsys):
    """--overwrite: a directory output is swapped whole (old files gone, new ones complete), a run directory's
    old contents are deleted once the new run succeeded."""
    import numpy as np

    from scratchlm.data.token_file import write_token_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("hello world, hello there. " * 50)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    args = ["tokenizer", "train", "--input", "text.txt", "--vocab-size", "270", "--out", "out", "--workers", "1"]
    assert main(args) == 2 and (tmp_path / "out" / "old.txt").exists()
    assert main(args + ["--overwrite"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "scratchlm_merges.txt", "scratchlm_tokenizer.json", "scratchlm_vocab.txt"]
    write_token_file(tmp_path / "t.bin", [np.tile(np.arange(50), 40)], 64)
    run = ["train", "--preset", "smoke", "--train_data=t.bin", "--out_dir=run", "--max_steps=2", "--warmup_steps=0",
           "--progress=false", "--peak_gflops=1", "--model.max_seq_len=16", "--seq_len=16", "--eval_batches=1"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert main(run) == 2 and "out_dir run already holds 1 entry (notes.txt)" in capsys.readouterr().err
    assert main(run + ["--overwrite"]) == 0
    assert not (tmp_path / "run" / "notes.txt").exists() and (tmp_path / "run" / "checkpoint").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left aside
