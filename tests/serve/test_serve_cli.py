"""`scratchlm serve` argument errors: one line on stderr, exit 2, no traceback, nothing left listening."""

from __future__ import annotations

import socket
from pathlib import Path

from scratchlm.cli.main import main
from scratchlm.serve.launch import default_model_name


def test_missing_checkpoint(tmp_path, capsys):
    assert main(["serve", "--checkpoint", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "does not exist" in err and "Traceback" not in err


def test_port_in_use(tiny_checkpoint, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--checkpoint", str(tiny_checkpoint), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--port" in err


def test_bad_port_and_threads(tiny_checkpoint, capsys):
    assert main(["serve", "--checkpoint", str(tiny_checkpoint), "--port", "70000"]) == 2
    assert "70000" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(tiny_checkpoint), "--threads", "0"]) == 2
    assert "--threads 0" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(tiny_checkpoint), "--device", "toaster"]) == 2
    assert "'toaster' is not a torch device" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(tiny_checkpoint), "--max-batch", "0"]) == 2
    assert "max_batch=0" in capsys.readouterr().err


def test_default_model_name(tmp_path):
    assert default_model_name(tmp_path / "mylm") == "mylm"
    assert default_model_name(tmp_path / "run7" / "checkpoint") == "run7"
    assert default_model_name(Path("/tmp/x/../mymodel")) == "mymodel"


def test_bad_operation_flags(tiny_checkpoint, capsys):
    base = ["serve", "--checkpoint", str(tiny_checkpoint)]
    for flags, named in ((["--max-queue", "-1"], "--max-queue -1"), (["--shutdown-timeout", "-5"], "--shutdown-timeout -5"),
                         (["--prefix-cache-mb", "-1"], "--prefix-cache-mb -1"), (["--allowed-hosts", ","], "--allowed-hosts"),
                         (["--max-context", "100000"], "--max-context 100000")):
        try:
            code = main(base + flags)
        except SystemExit as exc:  # argparse's own type errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
