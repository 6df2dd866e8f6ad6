"""Bad input across every command: exit 2, one line `scratchlm CMD: error: ...` naming the value and the fix,
no traceback, and nothing in the workspace changed (every path's kind, size, mtime and SHA-256 compared).

Most cases run in-process through scratchlm.cli.main.main(argv); a few run `python -m scratchlm` as a
subprocess to prove the exit status and the absence of a traceback end to end.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys

import pytest
import torch

from scratchlm.cli import tokenizer_cmd
from scratchlm.cli.main import main
from tests.integration.bad_input_workspace import build_workspace, snapshot

GUARD = "pass --overwrite to replace it or choose another path (nothing was changed)"
NOT_DIR = "afile is a file, not a directory"
CASES = [  # (argv, a substring of the one-line message, stdin)
    # convert
    ("convert --from-hf nope --out o", "source nope does not exist", None),
    ("convert --from-hf ckpt --out full", f"--out full already holds 1 entry (keep.txt); {GUARD}", None),
    ("convert --from-hf ckpt --out afile", "--out afile is a file, but a directory is written there", None),
    ("convert --from-hf ckpt --out afile/x", NOT_DIR, None),
    ("convert --to-hf ckpt --out run/checkpoint", "--out run/checkpoint already holds 4 entries", None),
    ("convert --from-hf ckpt --out run/checkpoint", "--out run/checkpoint already holds", None),
    ("convert --to-hf ckpt --out o --dtype float8", "argument --dtype: invalid choice: 'float8'", None),
    ("convert --to-hf afile --out o", "afile is a file but not a GGUF file", None),
    ("convert --to-gguf ckpt --out empty", "--out empty is a directory, but a file is written there", None),
    ("convert --to-gguf ckpt --out afile", "--out afile already holds a file of 13 bytes", None),
    # tokenizer train / encode
    ("tokenizer train --input text.txt --vocab-size 300 --out afile/tok", NOT_DIR, None),
    ("tokenizer train --input text.txt --vocab-size 300 --out full", GUARD, None),
    ("tokenizer train --input text.txt --vocab-size 300 --out afile", "is a file, but a directory is written", None),
    ("tokenizer train --input missing.txt --vocab-size 300 --out t1", "missing.txt does not exist", None),
    ("tokenizer train --input bad.txt --vocab-size 300 --out t1", "bad.txt is not valid UTF-8: byte 0xff at byte "
                                                                  "offset 11", None),
    ("tokenizer train --input text.txt --vocab-size 10 --out t1", "vocab_size 10 must be greater than 256", None),
    ("tokenizer train --input text.txt --vocab-size many --out t1", "invalid int value: 'many'", None),
    ("tokenizer encode --tokenizer tok --input text.txt --out empty", "--out empty is a directory", None),
    ("tokenizer encode --tokenizer tok --input text.txt --out afile/x.bin", NOT_DIR, None),
    ("tokenizer encode --tokenizer tok --input text.txt --out tokens.bin", "--out tokens.bin already holds", None),
    ("tokenizer encode --tokenizer nope --input text.txt --out x.bin", "no scratchlm tokenizer in nope", None),
    ("tokenizer encode --tokenizer badtok --input text.txt --out x.bin",
     "badtok/scratchlm_tokenizer.json is not valid JSON", None),
    ("tokenizer encode --tokenizer tok --input bad.txt --out x.bin", "pass --errors replace", None),
    ("tokenizer encode --tokenizer tok --input missing.txt --out x.bin", "input missing.txt does not exist", None),
    ("tokenizer encode --tokenizer tok --input text.txt --out x.bin --impl fast", "invalid choice: 'fast'", None),
    # train
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --lr=fast", "TrainConfig.lr must be a number, "
                                                                          "got 'fast'", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --compile=maybe", "TrainConfig.compile must be "
                                                                                "true or false, got 'maybe'", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=afile", "out_dir afile is a file", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=afile/sub", NOT_DIR, None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=full", f"out_dir full already holds 1 entry", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=run", "already holds a checkpoint at step 2; pass "
                                                                  "--resume to continue it, --overwrite", None),
    ("train --preset smoke --train_data=f16.bin --out_dir=o", "dtype 'float16' is not a token id type", None),
    ("train --preset smoke --train_data=garbage.bin --out_dir=o", "garbage.bin.json is not valid JSON", None),
    ("train --preset smoke --train_data=nodtype.bin --out_dir=o", "nodtype.bin.json has no 'dtype' field", None),
    ("train --preset smoke --train_data=missing.bin --out_dir=o", "token file missing.bin does not exist", None),
    ("train --preset smoke --train_data=empty --out_dir=o", "token file empty is a directory", None),
    ("train --config cfg_lr.json --out_dir=o", "TrainConfig.lr must be a number", None),
    ("train --config cfg_list.json --out_dir=o", "cfg_list.json must hold a JSON object, got list", None),
    ("train --config missing.json", "config file missing.json does not exist", None),
    ("train --preset nope", "unknown training preset 'nope'", None),
    ("train --resume --out_dir=run --max_steps=1", "is at step 2 but max_steps=1; nothing would be trained", None),
    ("train --resume --overwrite --out_dir=run", "pass only one", None),
    ("train --resume --out_dir=empty", "empty/train_config.json does not exist", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --spike_factor=0.5", "spike_factor must be > 1",
     None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --keep_last=0", "keep_last must be a positive", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --model.n_layers=abc",
     "ModelConfig.n_layers must be an integer, got 'abc'", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --batch_size=2.5", "batch_size must be an integer",
     None),
    ("train", "pass --config FILE or --preset NAME", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --seq_len=64 --model.max_seq_len=32",
     "seq_len=64 exceeds the model's max_seq_len=32", None),
    ("train --preset smoke --train_data=tokens.bin --out_dir=o --lrr=1", "unknown TrainConfig field(s) ['lrr']", None),
    ("train --preset smoke --train_data=tokens.bin --overwrite --out_dir=full --val_data=full/keep.txt",
     "lies inside out_dir full, which --overwrite would delete", None),
    # quickstart
    ("quickstart --out full", GUARD, None),
    ("quickstart --out afile", "--out afile is a file", None),
    ("quickstart --data missing.txt --out q1", "--data missing.txt does not exist", None),
    ("quickstart --out q1 --out_dir=x", "quickstart sets ['out_dir'] itself; use --out DIR", None),
    ("quickstart --minutes abc --out q1", "invalid float value: 'abc'", None),
    ("quickstart --out q1 --lr=fast", "TrainConfig.lr must be a number", None),
    ("quickstart --out q1 --model.n_layers=abc", "ModelConfig.n_layers must be an integer", None),
    ("quickstart --out q1 --minutes 0", "--minutes must be > 0", None),
    ("quickstart --out q1 --vocab-size 100", "--vocab-size 100 leaves no merges", None),
    # generate / chat
    ("generate --checkpoint nope --prompt hi", "model path nope does not exist", None),
    ("generate --checkpoint afile --prompt hi", "afile is a file but not a GGUF file", None),
    ("generate --checkpoint ckpt --prompt ''", "--prompt encodes to no tokens", None),
    ("generate --checkpoint ckpt --prompt hi --max-new-tokens 1000", "lower max_new_tokens to 30", None),
    ("generate --checkpoint ckpt --prompt hi --max-new-tokens 0", "max_new_tokens must be a positive integer", None),
    ("generate --checkpoint ckpt --prompt hi --temperature -1", "temperature=-1.0 is invalid", None),
    ("generate --checkpoint ckpt --prompt hi --tokenizer small_tok", "--tokenizer small_tok has 280 tokens but ckpt "
                                                                     "comes with a 300-token tokenizer", None),
    ("generate --checkpoint ckpt --prompt hi --top-p 2", "top_p=2.0 is invalid", None),
    ("generate --checkpoint ckpt --prompt hi --decode turbo", "invalid choice: 'turbo'", None),
    ("generate --checkpoint ckpt --prompt hi --tokenizer badtok", "scratchlm_tokenizer.json is not valid JSON", None),
    ("chat --checkpoint ckpt --max-new-tokens 1000", "--max-new-tokens 1000 must be between 1 and 31", "hi\n"),
    ("chat --checkpoint ckpt", "the last message is 318 tokens with the chat template, which fills the model's 32-token "
                              "context", " ".join(["word"] * 60) + "\n"),
    ("chat --checkpoint nope", "model path nope does not exist", "hi\n"),
    ("chat --checkpoint ckpt --temperature -1", "temperature=-1.0 is invalid", "hi\n"),
    # info
    ("info --preset nope", "unknown preset 'nope'", None),
    ("info --set n_layers=abc", "ModelConfig.n_layers must be an integer, got 'abc'", None),
    ("info --set tie_embeddings=maybe", "tie_embeddings must be true or false, got 'maybe'", None),
    ("info --set noequals", "override 'noequals' is not key=value", None),
    ("info --lr=1", "unrecognized arguments: --lr=1", None),
    ("info --seq-len 0", "--seq-len must be >= 1, got 0", None),
    # viz
    ("viz rope-decay --head-dim 7 --out r.png", "--head-dim must be a positive even number, got 7", None),
    ("viz rope-decay --out empty", "--out empty is a directory", None),
    ("viz rope-decay --out afile", "--out afile already holds a file", None),
    ("viz loss --metrics missing.jsonl --out l.png", "metrics file missing.jsonl does not exist", None),
    ("viz loss --metrics no_records.jsonl --out l.png", "has no complete records", None),
    ("viz attention --checkpoint ckpt --prompt '' --out a.png", "--prompt encodes to zero tokens", None),
    ("viz attention --checkpoint ckpt --prompt hi --layer 9 --out a.png", "--layer 9 is out of range", None),
    ("viz sampling --checkpoint ckpt --prompt hi --temperature 0 --out s.png", "--temperature must be > 0", None),
    # post-training, serve, eval
    ("sft --checkpoint ckpt --data robot.jsonl --out s1", "robot.jsonl line 1: messages[0] has role 'robot'; valid "
                                                          "roles: system, user, assistant, tool", None),
    ("sft --checkpoint ckpt --data latin1.jsonl --out s1", "latin1.jsonl line 2: not valid UTF-8", None),
    ("sft --checkpoint ckpt --data notjson.jsonl --out s1", "notjson.jsonl line 1: not valid JSON", None),
    ("sft --checkpoint ckpt --data missing.jsonl --out s1", "chat data file missing.jsonl does not exist", None),
    ("sft --checkpoint ckpt --data empty --out s1", "chat data file empty is a directory", None),
    ("sft --checkpoint ckpt --data chat.jsonl --out full", GUARD, None),
    ("sft --checkpoint ckpt --data chat.jsonl --out ckpt", "is the starting --checkpoint ckpt", None),
    ("dpo --checkpoint ckpt --data chat.jsonl --out d1", "chat.jsonl line 1: field 'prompt' must be a non-empty", None),
    ("grpo --checkpoint ckpt --data prompts.jsonl --out g1 --reward nope", "reward 'nope' is not a known reward", None),
    ("serve --checkpoint nope", "model path nope does not exist", None),
    ("serve --checkpoint ckpt --threads 0", "--threads 0 must be >= 1", None),
    ("serve --checkpoint ckpt --port abc", "invalid int value: 'abc'", None),
    ("eval --checkpoint ckpt --task perplexity --data missing.txt", "missing.txt does not exist", None),
    ("eval --checkpoint ckpt --task perplexity --data text.txt --out empty", "--out empty is a directory", None),
]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("bad_input")
    build_workspace(path)
    yield path
    torch.set_num_threads(before)


def _command(argv: list[str]) -> str:
    return " ".join(argv[:2]) if argv[0] in ("tokenizer", "viz") else argv[0]


def run_in_process(ws, argv: list[str], monkeypatch, capsys, stdin: str | None) -> tuple[int, str]:
    monkeypatch.chdir(ws)
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, expected, stdin", CASES, ids=[c[0][:70] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(ws, monkeypatch, capsys, argv, expected, stdin):
    args = shlex.split(argv)
    before = snapshot(ws)
    code, err = run_in_process(ws, args, monkeypatch, capsys, stdin)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert lines and lines[-1].startswith(f"scratchlm {_command(args)}: error: "), err
    assert expected in lines[-1], lines[-1]
    assert snapshot(ws) == before


def test_enough_cases_for_every_command():
    commands = {_command(shlex.split(c[0])) for c in CASES}
    assert len(CASES) >= 60
    assert {"convert", "tokenizer train", "tokenizer encode", "train", "quickstart", "generate", "chat", "info",
            "viz rope-decay", "viz loss", "viz attention", "viz sampling", "sft", "dpo", "grpo", "serve",
            "eval"} <= commands


def test_tokenizer_train_checks_out_before_training(ws, monkeypatch, capsys):
    def must_not_train(*args, **kwargs):
        raise AssertionError("trained before checking --out")

    monkeypatch.setattr(tokenizer_cmd, "train_bpe", must_not_train)
    code, err = run_in_process(ws, shlex.split("tokenizer train --input text.txt --vocab-size 300 --out full"),
                               monkeypatch, capsys, None)
    assert code == 2 and GUARD in err


def test_defaults_fit_the_models_context(ws, monkeypatch, capsys):
    """The command quickstart prints next works on a 32-token model: the default 128 is capped and said so."""
    before = snapshot(ws)
    code, err = run_in_process(ws, ["generate", "--checkpoint", "ckpt", "--prompt", "def "], monkeypatch, capsys, None)
    assert code == 0 and "[--max-new-tokens 28: the default 128 does not fit the model's 32-token context" in err
    code, err = run_in_process(ws, ["chat", "--checkpoint", "ckpt"], monkeypatch, capsys, "hi\n")
    assert code == 0 and "[--max-new-tokens 16: replies get half of the model's 32-token context" in err
    assert "[reply capped to 11 tokens: the conversation fills the rest of the 32-token context]" in err
    assert snapshot(ws) == before


@pytest.mark.parametrize("argv, expected", [
    ("tokenizer encode --tokenizer tok --input text.txt --out empty", "scratchlm tokenizer encode: error: --out empty "
                                                                      "is a directory"),
    ("train --preset smoke --train_data=tokens.bin --out_dir=afile", "scratchlm train: error: out_dir afile is a file"),
    ("convert --from-hf ckpt --out run/checkpoint", "scratchlm convert: error: --out run/checkpoint already holds"),
])
def test_end_to_end_exit_status_and_no_traceback(ws, argv, expected):
    before = snapshot(ws)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "scratchlm", *shlex.split(argv)], cwd=ws, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith(expected) and out.stderr.count("\n") == 1, out.stderr
    assert snapshot(ws) == before


def test_interactive_chat_goes_on_after_a_failed_turn_and_exits_2(ws, monkeypatch, capsys):
    """A tty session reports a turn that cannot fit, keeps going, and does not exit 0 (it used to)."""
    lines = iter([" ".join(["word"] * 60), "hi", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.chdir(ws)
    assert main(["chat", "--checkpoint", "ckpt"]) == 2
    err = capsys.readouterr().err
    assert "scratchlm chat: error: the last message is 318 tokens" in err
    assert err.rstrip().endswith("scratchlm chat: error: 1 turn(s) failed (see above)")
