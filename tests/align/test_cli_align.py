"""`scratchlm sft|dpo|ppo|grpo` end to end on a tiny byte-tokenizer model: outputs load, errors are one line."""

from __future__ import annotations

import json

import pytest
import torch

from scratchlm.align.toy_task import byte_tokenizer, toy_model_config
from scratchlm.model_files import load_model, save_model
from scratchlm.cli.main import main
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import Tokenizer


@pytest.fixture(autouse=True)
def _restore_threads():
    """The commands run with --threads 1 (tiny models); put torch's setting back for the rest of the suite."""
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


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys, argv):
    rc = main(argv + ["--threads", "1"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    return rc, json.loads(out)


def test_sft_cli(base, tmp_path, capsys):
    data = _jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": f"{a}+1"},
                                                          {"role": "assistant", "content": str(a + 1)}]}
                                           for a in range(5)])
    rc, out = _run(capsys, ["sft", "--checkpoint", str(base), "--data", str(data), "--out", str(tmp_path / "o"),
                            "--steps", "15", "--lr", "1e-2", "--batch-size", "5"])
    assert rc == 0 and out["assistant_loss_end"] < out["assistant_loss_start"]
    model = load_model(tmp_path / "o")
    assert Tokenizer.load(tmp_path / "o").vocab_size == 259 and model.config.vocab_size == 259
    history = (tmp_path / "o" / "align_history.jsonl").read_text().splitlines()
    assert len(history) == 15


def test_dpo_cli(base, tmp_path, capsys):
    data = _jsonl(tmp_path / "p.jsonl", [{"prompt": f"{a}=", "chosen": "yes", "rejected": "no"} for a in range(4)])
    rc, out = _run(capsys, ["dpo", "--checkpoint", str(base), "--data", str(data), "--out", str(tmp_path / "o"),
                            "--steps", "10", "--lr", "1e-2", "--loss-type", "robust", "--label-smoothing", "0.1"])
    assert rc == 0 and out["preference_accuracy_end"] == 1.0
    cfg = json.loads((tmp_path / "o" / "align_config.json").read_text())
    assert cfg["config"]["loss_type"] == "robust" and cfg["command"] == "dpo"


@pytest.mark.parametrize("command,extra", [
    ("grpo", ["--preset", "dapo", "--clip-high", "0.3", "--overlong-buffer", "2", "--mask-truncated", "true"]),
    ("grpo", ["--preset", "gspo", "--num-iterations", "2"]),
    ("ppo", ["--ppo-epochs", "1", "--dual-clip", "3", "--entropy-coef", "0.01", "--whiten-rewards",
             "--missing-eos-penalty", "1"]),
])
def test_rl_cli(base, tmp_path, capsys, command, extra):
    data = _jsonl(tmp_path / "rl.jsonl", [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(4)])
    rc, out = _run(capsys, [command, "--checkpoint", str(base), "--data", str(data), "--out", str(tmp_path / "o"),
                            "--reward", "exact_match", "--steps", "2", "--max-new-tokens", "3",
                            "--prompts-per-step", "2", *extra])
    assert rc == 0 and out["steps"] == 2
    cfg = json.loads((tmp_path / "o" / "align_config.json").read_text())["config"]
    if command == "grpo":
        assert cfg["loss"]["clip_high"] == (0.3 if "dapo" in extra else 4e-4)
        assert cfg["loss"]["overlong_buffer"] == (2 if "dapo" in extra else 0)
        assert cfg["loss"]["mask_truncated"] == ("dapo" in extra)
    else:
        assert cfg["dual_clip"] == 3.0 and cfg["entropy_coef"] == 0.01 and cfg["whiten_rewards"]
    load_model(tmp_path / "o")


def test_cli_errors_are_one_line(base, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "answer": "1"}\n{oops\n')
    rc = main(["grpo", "--checkpoint", str(base), "--data", str(bad), "--out", str(tmp_path / "o"),
               "--reward", "exact_match"])
    err = capsys.readouterr().err
    assert rc == 2 and "line 2: not valid JSON" in err and "Traceback" not in err
    good = _jsonl(tmp_path / "good.jsonl", [{"prompt": "1=", "answer": "1"}])
    rc = main(["grpo", "--checkpoint", str(base), "--data", str(good), "--out", str(tmp_path / "o"),
               "--reward", "exact_match", "--group-size", "1"])
    assert rc == 2 and "use G >= 2" in capsys.readouterr().err
    rc = main(["grpo", "--checkpoint", str(base), "--data", str(good), "--out", str(tmp_path / "o"),
               "--reward", "exact_match", "--preset", "gspo", "--loss-agg", "seq-mean-token-sum-norm",
               "--temperature", "0"])
    assert rc == 2 and "temperature > 0" in capsys.readouterr().err
