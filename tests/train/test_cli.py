"""`scratchlm train` and `scratchlm quickstart` end to end, config validation and override parsing."""

import json
import math

import pytest

from scratchlm.model_files import load_model
from scratchlm.cli.main import main
from scratchlm.data.corpus import default_corpus, load_corpus
from scratchlm.data.token_file import open_token_file
from scratchlm.tokenizer import Tokenizer
from scratchlm.train.train_config import TrainConfig, parse_cli_overrides
from scratchlm.train.presets import TRAIN_PRESETS, get_train_preset
from scratchlm.train.quickstart import quickstart
from tests.train.conftest import TINY_MODEL


def test_override_parsing_and_validation(tmp_path):
    assert parse_cli_overrides(["--lr=3e-4", "--model.n_layers", "6", "--compile=true", "--out-dir=x"]) == {
        "lr": 3e-4, "model.n_layers": 6, "compile": True, "out_dir": "x"}
    with pytest.raises(ValueError, match="no value"):
        parse_cli_overrides(["--lr"])
    with pytest.raises(ValueError, match=r"unknown TrainConfig field\(s\) \['lrr'\]"):
        TrainConfig().with_overrides({"lrr": 1.0})
    for bad, pattern in [({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
                         ({"lr": -1.0}, "lr > 0"), ({"dtype": "fp8"}, r"dtype='fp8' is not one of"),
                         ({"warmup_steps": 5000}, "warmup_steps=5000 exceeds max_steps=1000"),
                         ({"beta2": 1.0}, r"beta2 must be in \[0, 1\)"), ({"grad_clip": -1}, "grad_clip")]:
        with pytest.raises(ValueError, match=pattern):
            TrainConfig(**bad)
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        TrainConfig.from_json(tmp_path / "c.json")
    for name in TRAIN_PRESETS:
        assert get_train_preset(name).to_dict() == TrainConfig.from_dict(get_train_preset(name).to_dict()).to_dict()


def test_train_cli_runs_resumes_and_reports_errors(tmp_path, tokens, capsys):
    args = ["train", "--preset", "smoke", f"--train_data={tokens}", f"--out_dir={tmp_path / 'run'}", "--max_steps=6",
            "--stop_at_step=3", "--progress=false", "--peak_gflops=1", "--eval_interval=3",
            f"--model.max_seq_len={TINY_MODEL['max_seq_len']}", "--seq_len=16"]
    assert main(args) == 0
    assert main(["train", "--resume", f"--out_dir={tmp_path / 'run'}", "--stop_at_step=0"]) == 0
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["trainer"]["step"] == 6
    assert main(args) == 2  # a fresh run into an existing checkpoint
    assert "already holds a checkpoint at step 6" in capsys.readouterr().err
    assert main(["train", "--preset", "nope"]) == 2
    assert "available: ['quickstart', 'shakespeare-char', 'smoke']" in capsys.readouterr().err
    assert main(["train", "--preset", "smoke", "--lr=-1"]) == 2
    with pytest.raises(SystemExit):
        main(["info", "--lr=1"])  # commands that take no overrides still reject unknown flags


def test_default_corpus_and_user_data(tmp_path):
    text = default_corpus(200_000)
    assert 150_000 < len(text.encode()) <= 200_000
    assert "assert" in text and "def " in text  # pydoc topics and stdlib sources
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n\n{"text": "world"}\n')
    assert load_corpus(tmp_path / "d.jsonl") == "hello\n\nworld"
    (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_corpus(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(tmp_path / "missing.txt")


def test_quickstart_end_to_end_on_user_text(tmp_path, shared_data):
    out = tmp_path / "qs"
    tiny = {f"model.{k}": v for k, v in TINY_MODEL.items()}
    result = quickstart(out, data=str(shared_data / "tinyshakespeare.txt"), minutes=5, vocab_size=400,
                        max_bytes=60_000, progress=False, max_steps=8, warmup_steps=2, seq_len=16, batch_size=4,
                        eval_interval=8, eval_batches=2, peak_gflops=1.0, **tiny)
    assert result.val_loss is not None and result.val_loss < 6.0  # ln(400) = 5.99 is chance
    ids = open_token_file(out / "tokens.bin")
    val = [int(i) for i in ids[int(len(ids) * 0.9):]]  # the last 10% of the tokens
    n_bytes = len(Tokenizer.load(result.checkpoint).decode_bytes(val))
    assert result.val_bits_per_byte == pytest.approx(result.val_loss * len(val) / n_bytes / math.log(2), rel=1e-9)
    model = load_model(result.checkpoint)
    tok = Tokenizer.load(result.checkpoint)
    assert model.config.vocab_size == tok.vocab_size
    for prompt, text in result.samples.items():
        assert text.startswith(prompt) and len(text) > len(prompt)
    assert (out / "loss.png").exists() and (out / "corpus.txt").read_text().startswith("First Citizen")
    with pytest.raises(FileExistsError, match="--overwrite"):
        quickstart(out, data=str(shared_data / "tinyshakespeare.txt"))
    with pytest.raises(ValueError, match=r"quickstart sets \['out_dir'\] itself; use --out DIR"):
        quickstart(tmp_path / "other", out_dir=str(tmp_path / "x"))
