"""`scratchlm convert`: Hugging Face checkpoint directory <-> scratchlm checkpoint directory.

    scratchlm convert --from-hf HF_DIR --out OUT_DIR      # -> config.json + model.safetensors (scratchlm)
    scratchlm convert --to-hf CKPT_DIR --out OUT_DIR      # -> HF config.json + safetensors (+ index)
Tokenizer files travel with the model (see scratchlm.interop.tokenizer_files).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from scratchlm.checkpoint import load_model, save_model
from scratchlm.cli.outputs import add_output_arg
from scratchlm.interop.pretrained import from_pretrained, save_pretrained
from scratchlm.interop.tokenizer_files import tokenizer_from_hf, tokenizer_to_hf
from scratchlm.io_utils import atomic_output_dir

DTYPES = ("float32", "bfloat16", "float16")


def _check_dirs(src: str, out: str) -> tuple[Path, Path]:
    src_dir, out_dir = Path(src), Path(out)
    if not src_dir.is_dir():
        raise FileNotFoundError(f"source directory {src_dir} does not exist")
    if src_dir.resolve() == out_dir.resolve():
        raise ValueError(f"--out {out_dir} is the source directory; write the converted model somewhere else")
    return src_dir, out_dir


def run_convert(args: argparse.Namespace) -> int:
    """Convert one way or the other and print what was written (OUT is swapped in atomically)."""
    if args.from_hf:
        src, out = _check_dirs(args.from_hf, args.out)
        model = from_pretrained(src, progress=True)
        with atomic_output_dir(out, args.overwrite) as tmp:
            save_model(model, tmp)
            extra = tokenizer_from_hf(src, tmp)
    else:
        src, out = _check_dirs(args.to_hf, args.out)
        model = load_model(src)
        dtype = getattr(torch, args.dtype) if args.dtype else None
        with atomic_output_dir(out, args.overwrite) as tmp:
            save_pretrained(model, tmp, max_shard_size=args.max_shard_size, dtype=dtype, progress=True)
            extra = tokenizer_to_hf(src, tmp)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({n_params:,} parameters; tokenizer: {', '.join(extra) if extra else 'none found'})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face checkpoint to scratchlm or back")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-hf", metavar="DIR", help="HF directory (Llama, Qwen2, Qwen3, GPT-2) to import")
    way.add_argument("--to-hf", metavar="DIR", help="scratchlm checkpoint directory to export")
    add_output_arg(p, "--out", kind="dir", required=True, metavar="DIR",
                   help="output directory (written as one atomic swap; must be new or empty unless --overwrite)")
    p.add_argument("--max-shard-size", default="5GB", help="--to-hf: shard above this size (e.g. 500MB)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="--to-hf: cast weights (default: as stored)")
    p.set_defaults(func=run_convert)
