"""A small workspace for the bad-input tests: a tiny checkpoint with its tokenizer, token files (good and
corrupt), a finished training run, JSONL files, and paths that are files where directories go."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from scratchlm.model_files import save_model
from scratchlm.config import get_preset
from scratchlm.data.token_file import write_token_file
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
from scratchlm.train.train_config import TrainConfig
from scratchlm.train.loop import train

TEXT = "The quick brown fox jumps over the lazy dog. " * 40 + "def main():\n    return 0\n" * 20


def _tokenizer(ws: Path, name: str, vocab: int) -> Tokenizer:
    vocab_map, merges = train_bpe(ws / "text.txt", vocab, DEFAULT_SPECIAL_TOKENS, num_workers=1)
    tok = Tokenizer(vocab_map, merges, DEFAULT_SPECIAL_TOKENS)
    tok.save(ws / name)
    return tok


def _jsonl(path: Path, lines: list) -> None:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))


def build_workspace(ws: Path) -> None:
    """Fill `ws` (see module docstring); deterministic and a few seconds on one thread."""
    (ws / "text.txt").write_text(TEXT)
    (ws / "bad.txt").write_bytes(b"good start \xff\xfe bad bytes\n")
    tok = _tokenizer(ws, "tok", 300)
    _tokenizer(ws, "small_tok", 280)
    config = get_preset("llama-tiny", vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=32)
    save_model(TransformerLM(config), ws / "ckpt")
    tok.save(ws / "ckpt")
    ids = np.tile(np.asarray(tok.encode(TEXT), dtype=np.int64), 4)
    write_token_file(ws / "tokens.bin", [ids], tok.vocab_size)
    for name, meta in (("f16.bin", {"dtype": "float16", "n_tokens": 8, "vocab_size": 300}),
                       ("nodtype.bin", {"n_tokens": 8, "vocab_size": 300})):
        (ws / name).write_bytes(b"\0" * 16)
        (ws / f"{name}.json").write_text(json.dumps(meta))
    (ws / "garbage.bin").write_bytes(b"\0" * 16)
    (ws / "garbage.bin.json").write_text("{not json")
    (ws / "badtok").mkdir()
    (ws / "badtok" / "scratchlm_tokenizer.json").write_text('{"format": ')
    (ws / "afile").write_text("a plain file\n")
    (ws / "full").mkdir()
    (ws / "full" / "keep.txt").write_text("keep me\n")
    (ws / "empty").mkdir()
    (ws / "cfg_lr.json").write_text(json.dumps({"train_data": "tokens.bin", "lr": "fast"}))
    (ws / "cfg_list.json").write_text("[1, 2]")
    (ws / "no_records.jsonl").write_text("")
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    _jsonl(ws / "chat.jsonl", [chat])
    _jsonl(ws / "robot.jsonl", [{"messages": [{"role": "robot", "content": "beep"},
                                              {"role": "assistant", "content": "ok"}]}])
    _jsonl(ws / "notjson.jsonl", ["{oops"])
    (ws / "latin1.jsonl").write_bytes(json.dumps(chat).encode() + b'\n{"messages": "caf\xe9"}\n')
    _jsonl(ws / "prompts.jsonl", [{"prompt": "2+2=", "answer": "4"}])
    train(TrainConfig(model={"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}, train_data=str(
        ws / "tokens.bin"), out_dir=str(ws / "run"), batch_size=2, seq_len=16, max_steps=2, warmup_steps=0,
        eval_interval=2, eval_batches=1, ckpt_interval=2, log_interval=1, peak_gflops=1.0, progress=False))


def snapshot(ws: Path) -> dict[str, tuple]:
    """Every path under `ws` with its kind, size, mtime and (files) SHA-256: equal snapshots = nothing changed."""
    out = {}
    for p in sorted(ws.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        out[str(p.relative_to(ws))] = (p.is_dir(), st.st_size if p.is_file() else 0, st.st_mtime_ns, digest)
    return out
