"""`scratchlm quickstart`: the main job, from raw text to a trained model and samples in one command.

    scratchlm quickstart                          # default corpus (Python stdlib + pydoc text), 3 minutes
    scratchlm quickstart --data my.txt --minutes 10 --out runs/mine
"""

from __future__ import annotations

import argparse

from scratchlm.cli.outputs import add_output_arg
from scratchlm.train.train_config import parse_cli_overrides
from scratchlm.train.quickstart import quickstart


def run_quickstart(args: argparse.Namespace) -> int:
    result = quickstart(args.out, args.data, args.minutes, args.vocab_size, args.max_bytes, args.overwrite,
                        **parse_cli_overrides(args.overrides))
    print("\n== samples (temperature 0.8, top-k 40) ==")
    for text in result.samples.values():
        print(f"--- {text!r}")
    val = f"{result.val_loss:.4f} nats/token ({result.val_bits_per_byte:.3f} bits/byte)" if result.val_loss else "n/a"
    print(f"\nvalidation loss: {val}")
    print(f"model + tokenizer: {result.checkpoint}  (scratchlm generate --checkpoint {result.checkpoint} --prompt ...)")
    print(f"loss curve: {result.out_dir / 'loss.png'}; metrics: {result.out_dir / 'metrics.jsonl'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="main job: build a corpus, train a BPE tokenizer and a tiny llama, sample",
                       allow_abbrev=False,
                       description="Train a tokenizer and a tiny llama-style model on the default corpus "
                                   "(Python stdlib sources + pydoc topics) or --data PATH; any TrainConfig field "
                                   "can be overridden as --key=value.")
    p.add_argument("--data", help="your own text: a .txt/.jsonl file or a directory of them")
    add_output_arg(p, "--out", kind="dir", default="runs/quickstart",
                   help="run directory (default: runs/quickstart); new or empty unless --overwrite")
    p.add_argument("--minutes", type=float, default=3.0, help="training time budget (default: 3)")
    p.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary size (default: 2048)")
    p.add_argument("--max-bytes", type=int, default=4_000_000, help="cut the corpus at this many bytes")
    p.set_defaults(func=run_quickstart, accepts_overrides=True)
