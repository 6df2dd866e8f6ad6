"""`scratchlm convert`: between scratchlm checkpoints, Hugging Face directories and GGUF files.

    scratchlm convert --from-hf HF_DIR_OR.gguf --out OUT_DIR     # -> scratchlm checkpoint (config.json + model.safetensors)
    scratchlm convert --to-hf CKPT_DIR_OR.gguf --out OUT_DIR     # -> HF config.json + safetensors (+ index)
    scratchlm convert --to-gguf MODEL --out OUT.gguf --type q8_0 # -> GGUF (f32, f16, bf16, q8_0) for llama.cpp
--to-gguf writes the llama.cpp architecture that computes the model exactly (interop/gguf/architectures.py: llama
with Mistral / Mixtral, qwen2, qwen3, qwen2moe, qwen3moe, gemma, gemma2, gemma3, phi3, olmo2, granite, smollm3) or
refuses, naming what llama.cpp would run differently; K-quants: llama.cpp's quantizer on the f32 / f16 file.
Tokenizer files travel with the model (see scratchlm.interop.hf.tokenizer_copy); a GGUF's tokenizer, chat
template and end-of-reply tokens become tokenizer.json, tokenizer_config.json and generation_config.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from scratchlm.model_files import save_model
from scratchlm.cli.outputs import add_output_arg
from scratchlm.interop.gguf.writer import EXPORT_TYPES, save_gguf
from scratchlm.interop.hf.model_dir import save_pretrained
from scratchlm.interop.hf.tokenizer_copy import TOKENIZER_JSON, tokenizer_from_hf, tokenizer_to_hf
from scratchlm.io_utils import atomic_output_dir
from scratchlm.load import LoadedModel, from_pretrained, load_pretrained, model_kind, write_model_extras

DTYPES = ("float32", "bfloat16", "float16")


def _check_paths(src: str, out: str) -> tuple[Path, Path]:
    src_path, out_path = Path(src), Path(out)
    if not src_path.exists():
        raise FileNotFoundError(f"source {src_path} does not exist")
    if src_path.resolve() == out_path.resolve():
        raise ValueError(f"--out {out_path} is the source directory; write the converted model somewhere else")
    return src_path, out_path


def _gguf_tokenizer_files(loaded: LoadedModel, out: Path) -> list[str]:
    """A GGUF's tokenizer as tokenizer.json + tokenizer_config.json (+ generation_config.json)."""
    loaded.tokenizer.save_hf_json(out / TOKENIZER_JSON)
    return [TOKENIZER_JSON, *write_model_extras(loaded, out)]


def _from_hf(src: Path, out: Path, overwrite: bool) -> tuple[torch.nn.Module, list[str]]:
    if model_kind(src)[0] == "gguf":
        loaded = load_pretrained(src, dtype=torch.float32, keep_quantized=False, progress=True)
        with atomic_output_dir(out, overwrite) as tmp:
            save_model(loaded.model, tmp)
            return loaded.model, _gguf_tokenizer_files(loaded, tmp)
    model = from_pretrained(src, dtype=torch.float32, progress=True)
    with atomic_output_dir(out, overwrite) as tmp:
        save_model(model, tmp)
        return model, tokenizer_from_hf(src, tmp)


def _to_hf(src: Path, out: Path, args: argparse.Namespace) -> tuple[torch.nn.Module, list[str]]:
    kind, _ = model_kind(src)  # a clear error for a path that is no model
    dtype = getattr(torch, args.dtype) if args.dtype else None
    loaded = load_pretrained(src, dtype=torch.float32, keep_quantized=False, progress=True) if kind == "gguf" else None
    model = loaded.model if loaded is not None else from_pretrained(src, dtype=torch.float32)
    with atomic_output_dir(out, args.overwrite) as tmp:
        save_pretrained(model, tmp, max_shard_size=args.max_shard_size, dtype=dtype, progress=True)
        return model, _gguf_tokenizer_files(loaded, tmp) if loaded is not None else tokenizer_to_hf(src, tmp)


def _to_gguf(src: Path, out: Path, args: argparse.Namespace) -> tuple[torch.nn.Module, list[str]]:
    model_kind(src)  # a clear error for a path that is no model
    loaded = load_pretrained(src, dtype=torch.float32, keep_quantized=False, progress=True)
    template = loaded.chat_template if isinstance(loaded.chat_template, str) else None
    save_gguf(loaded.model, out, type_name=args.type.upper(), tokenizer=loaded.tokenizer, chat_template=template,
              bos_token_id=loaded.bos_token_id, stop_token_ids=loaded.stop_token_ids, name=src.name)
    return loaded.model, ["tokenizer.ggml.*"] + (["chat template"] if template else [])


def run_convert(args: argparse.Namespace) -> int:
    """Convert and print what was written (OUT is swapped in atomically)."""
    if args.from_hf:
        src, out = _check_paths(args.from_hf, args.out)
        model, extra = _from_hf(src, out, args.overwrite)
    elif args.to_hf:
        src, out = _check_paths(args.to_hf, args.out)
        model, extra = _to_hf(src, out, args)
    else:
        src, out = _check_paths(args.to_gguf, args.out)
        model, extra = _to_gguf(src, out, args)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({n_params:,} parameters; tokenizer: {', '.join(extra) if extra else 'none found'})")
    return 0


class _GGUFOut(argparse.Action):
    """--to-gguf: the output is a file, not a directory (the output guard checks it as one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.outputs = tuple((dest, flag, "file" if dest == "out" else kind, comp)
                                  for dest, flag, kind, comp in namespace.outputs)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert between scratchlm checkpoints, Hugging Face dirs and GGUF files")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-hf", metavar="PATH", help="HF directory (any family of interop/hf/families.py) or .gguf "
                     "file (any architecture of interop/gguf/architectures.py) to import")
    way.add_argument("--to-hf", metavar="PATH", help="scratchlm checkpoint directory or .gguf file to export as HF")
    way.add_argument("--to-gguf", metavar="PATH", action=_GGUFOut,
                     help="model to export as GGUF (a scratchlm checkpoint dir, an HF dir or a .gguf file)")
    add_output_arg(p, "--out", kind="dir", required=True, metavar="PATH",
                   help="output directory (--to-gguf: output file); written atomically, must be new or empty "
                        "unless --overwrite")
    p.add_argument("--max-shard-size", default="5GB", help="--to-hf: shard above this size (e.g. 500MB)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="--to-hf: cast weights (default: as stored)")
    p.add_argument("--type", choices=[t.lower() for t in EXPORT_TYPES], default="f16",
                   help="--to-gguf: matrix type (f32, f16, bf16, q8_0; norms, biases, routers stay f32; rows that "
                        "do not split into q8_0 blocks are f16; K-quants: llama.cpp's quantizer on this file; default f16)")
    p.set_defaults(func=run_convert)
