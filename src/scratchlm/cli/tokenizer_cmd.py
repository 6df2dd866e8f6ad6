"""`scratchlm tokenizer train|encode`: train a byte-level BPE, encode a text file into a token file."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from scratchlm.cli.outputs import add_output_arg
from scratchlm.data.token_file import write_token_file
from scratchlm.io_utils import atomic_output_dir
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
from scratchlm.tokenizer.stream_encode import encode_stream_chunks
from scratchlm.tokenizer.text_io import decode_utf8

READ_BYTES = 1 << 16


def read_text_blocks(path: Path, errors: str, bar: tqdm) -> Iterator[str]:
    """Decode `path` as UTF-8 block by block (cut at character starts); errors name the byte offset."""
    offset, carry = 0, b""
    with open(path, "rb") as f:
        while True:
            raw = f.read(READ_BYTES)
            data = carry + raw
            cut = len(data)
            if raw:  # keep an unfinished multi-byte char for the next block
                while cut > 0 and len(data) - cut < 3 and data[cut - 1] & 0xC0 == 0x80:
                    cut -= 1
                if cut > 0 and data[cut - 1] >= 0xC0:
                    cut -= 1
            text = decode_utf8(data[:cut], path, offset, errors, "pass --errors replace")
            offset += cut
            carry = data[cut:]
            bar.update(len(raw))
            if text:
                yield text
            if not raw:
                return


def run_train(args: argparse.Namespace) -> int:
    specials = args.special if args.special is not None else list(DEFAULT_SPECIAL_TOKENS)
    t0 = time.perf_counter()
    vocab, merges = train_bpe(
        args.input, args.vocab_size, specials, num_workers=args.workers, errors=args.errors, progress=True
    )
    tok = Tokenizer(vocab, merges, specials)
    with atomic_output_dir(args.out, args.overwrite) as tmp:  # --out was checked before training (cli.main)
        tok.save(tmp)
        if args.hf_json:
            tok.save_hf_json(tmp / "tokenizer.json")
    report = {"out": str(args.out), "vocab_size": tok.vocab_size, "merges": len(merges),
              "special_tokens": tok.special_token_ids, "seconds": round(time.perf_counter() - t0, 2)}
    print(json.dumps(report))
    return 0


def run_encode(args: argparse.Namespace) -> int:
    tok = Tokenizer.load(args.tokenizer, impl=args.impl)
    path = Path(args.input)
    if not path.is_file():
        raise FileNotFoundError(f"input {path} does not exist or is not a file")
    t0 = time.perf_counter()
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="encode") as bar:
        blocks = read_text_blocks(path, args.errors, bar)
        n = write_token_file(args.out, encode_stream_chunks(tok, blocks), tok.vocab_size, overwrite=args.overwrite)
    dt = time.perf_counter() - t0
    print(json.dumps({"out": str(args.out), "tokens": n, "vocab_size": tok.vocab_size, "seconds": round(dt, 2),
                      "mb_per_s": round(path.stat().st_size / 1e6 / max(dt, 1e-9), 2)}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer or encode text into a token file")
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND", required=True)
    t = tsub.add_parser("train", help="train a BPE tokenizer on text files")
    t.add_argument("--input", nargs="+", required=True, metavar="FILE", help="UTF-8 text files (each a document)")
    t.add_argument("--vocab-size", type=int, required=True, help="256 bytes + specials + merges")
    t.add_argument("--special", action="append", default=None, metavar="TOKEN",
                   help=f"special token, repeatable (default: {' '.join(DEFAULT_SPECIAL_TOKENS)})")
    add_output_arg(t, "--out", kind="dir", required=True, metavar="DIR",
                   help="directory for the tokenizer files (new or empty unless --overwrite; checked before training)")
    t.add_argument("--workers", type=int, default=None, help="pre-tokenization processes (default: all cores)")
    t.add_argument("--errors", choices=("strict", "replace"), default="strict", help="invalid UTF-8: fail or U+FFFD")
    t.add_argument("--hf-json", action="store_true", help="also write DIR/tokenizer.json for HF tokenizers")
    t.set_defaults(func=run_train)
    e = tsub.add_parser("encode", help="encode a text file into a uint16/uint32 token file (+ .json sidecar)")
    e.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer (or model) directory")
    e.add_argument("--input", required=True, metavar="FILE", help="UTF-8 text file")
    add_output_arg(e, "--out", kind="file", companions=(".json",), required=True, metavar="FILE.bin",
                   help="token file to write atomically, + FILE.bin.json (new unless --overwrite)")
    e.add_argument("--impl", choices=("reference", "tiktoken"), default="reference", help="encoder (same ids)")
    e.add_argument("--errors", choices=("strict", "replace"), default="strict", help="invalid UTF-8: fail or U+FFFD")
    e.set_defaults(func=run_encode)
