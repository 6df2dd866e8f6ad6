"""The console script: `scratchlm --help` lists commands; `scratchlm info` reports the true sizes."""

import json
import subprocess
import sys

from scratchlm.cli.main import main
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM


def test_help_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "scratchlm.cli.main", "--help"], capture_output=True, text=True, check=True)
    for command in ("info", "presets"):
        assert command in out.stdout


def test_info_reports_param_count(capsys) -> None:
    assert main(["info", "--preset", "gpt2-tiny", "--seq-len", "16", "--batch-size", "1", "--repeats", "1",
                 "--set", "n_layers=2"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = sum(p.numel() for p in TransformerLM(get_preset("gpt2-tiny", n_layers=2)).parameters())
    assert report["params"] == expected and report["config"]["n_layers"] == 2


def test_info_bad_preset_is_one_line_error(capsys) -> None:
    assert main(["info", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'nope'" in err and "Traceback" not in err
