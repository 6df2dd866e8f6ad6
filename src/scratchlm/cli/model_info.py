"""`scratchlm info`, `scratchlm presets` and `scratchlm models`: what a model is, its size and speed.

    scratchlm info --preset llama-small               # a fresh model from a preset
    scratchlm info --checkpoint model.gguf            # a loaded model (scratchlm dir, HF dir or .gguf)
    scratchlm models runs/sft hf/qwen2 model.gguf     # one line per model: kind, family, params, dtype, context, template

For a GGUF file `models` adds what the file holds, read from its header (the model's own line first):

    gguf SmolLM2-135M-Instruct.Q4_1.gguf: llama 'Smollm2 ...', 134.5M params, float32 (...), context 8192 ...
      architecture: llama, 30 blocks, embedding 576, 9 heads, 3 kv heads, feed-forward 1536, context 8192
      block types: Q4_1 210, F32 61, Q8_0 1
      tokenizer: gpt2 (byte-level BPE), 49152 tokens, pre-tokenizer 'smollm'
      file: GGUF v3, 272 tensors, 33 metadata keys, 103.7 MB
A file scratchlm cannot load still gets those lines, the unsupported parts marked "(not supported)", then
one error line naming every problem (architecture, block types, tokenizer) and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from scratchlm.config import PRESETS, get_preset
from scratchlm.model import TransformerLM
from scratchlm.model_stats import model_stats

if TYPE_CHECKING:
    from scratchlm.interop.gguf.reader import GGUFContents


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """Parse ["key=value", ...] into a dict, values as JSON when they parse (ints, floats, bools)."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"override {pair!r} is not key=value (e.g. --set n_layers=6)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def run_info(args: argparse.Namespace) -> int:
    for flag in ("batch_size", "seq_len", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.checkpoint:
        if args.set:
            raise ValueError("--set overrides a preset's fields; with --checkpoint the model's own config is used")
        from scratchlm.load import load_pretrained

        loaded = load_pretrained(args.checkpoint, keep_quantized=False)
        print(loaded.summary())
        model, config, source = loaded.model, loaded.model.config, {"checkpoint": str(args.checkpoint)}
    else:
        config = get_preset(args.preset, **parse_overrides(args.set))
        torch.manual_seed(0)
        model, source = TransformerLM(config).eval(), {"preset": args.preset}
    t = min(args.seq_len, config.max_seq_len)
    stats = model_stats(model, config, seq_len=t)
    ids = torch.randint(0, config.vocab_size, (args.batch_size, t))
    with torch.no_grad():
        model(ids)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            model(ids)
        dt = (time.perf_counter() - t0) / args.repeats
    tokens = args.batch_size * t
    report = {
        **source,
        "config": config.to_dict(),
        "params": stats.n_params,
        "embedding_params": stats.n_embedding,
        "matmul_params": stats.n_matmul,
        "flops_per_token_fwd": stats.flops_per_token_fwd,
        "flops_per_token_train": stats.flops_per_token_train,
        "forward_batch": [args.batch_size, t],
        "forward_ms": round(dt * 1e3, 2),
        "forward_tok_s": round(tokens / dt, 1),
        "forward_gflop_s": round(tokens * stats.flops_per_token_fwd / dt / 1e9, 2),
    }
    print(json.dumps(report, indent=2))
    return 0


def run_presets(args: argparse.Namespace) -> int:
    for name in sorted(PRESETS):
        c = get_preset(name)
        print(f"{name:14s} vocab={c.vocab_size} layers={c.n_layers} d_model={c.d_model} heads={c.n_heads}"
              f"/{c.n_kv_heads} d_ff={c.d_ff} ctx={c.max_seq_len} pos={c.pos_embedding} norm={c.norm} ffn={c.ffn}")
    return 0


TOKENIZER_KINDS = {"gpt2": "byte-level BPE", "llama": "SentencePiece-style", "bert": "WordPiece", "t5": "Unigram",
                   "rwkv": "RWKV", "none": "no vocabulary"}
_ARCH_FIELDS = (("block_count", "{} blocks"), ("embedding_length", "embedding {}"),
                ("attention.head_count", "{} heads"), ("attention.head_count_kv", "{} kv heads"),
                ("feed_forward_length", "feed-forward {}"), ("expert_count", "{} experts"),
                ("context_length", "context {}"))
_NOT_SUPPORTED = " (not supported)"


def _short(value: Any) -> str:
    """A metadata value for one line: per-layer arrays shortened."""
    if isinstance(value, list):
        return f"[{', '.join(map(str, value[:3]))}{', ...' if len(value) > 3 else ''}] ({len(value)} values)"
    return str(value)


def gguf_description(contents: GGUFContents, problems: dict[str, str]) -> list[str]:
    """The lines `models` prints for a GGUF file (module docstring); `problems` marks what is not supported."""
    meta = contents.metadata
    arch = meta.get("general.architecture")
    fields = [(label.removesuffix("s") if meta[f"{arch}.{key}"] == 1 else label).format(_short(meta[f"{arch}.{key}"]))
              for key, label in _ARCH_FIELDS if f"{arch}.{key}" in meta]  # "1 block", "30 blocks"
    refused = {t.type_name for t in contents.tensors.values() if not t.supported}
    types = ", ".join(f"{t if isinstance(t, str) else f'type id {t}'} {n}"
                      f"{_NOT_SUPPORTED if t in refused else ''}" for t, n in contents.type_counts().items())
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        tokenizer = "none in the file (no tokenizer.ggml.model)"
    else:
        pre = meta.get("tokenizer.ggml.pre")
        n = len(meta.get("tokenizer.ggml.tokens") or [])
        tokenizer = (f"{model} ({TOKENIZER_KINDS.get(model, 'unknown kind')}), {n} tokens"
                     f"{f', pre-tokenizer {pre!r}' if pre else ''}")
    size = contents.path.stat().st_size
    size_text = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size} bytes"
    return [f"  architecture: {', '.join([str(arch), *fields])}{_NOT_SUPPORTED if 'architecture' in problems else ''}",
            f"  block types: {types or 'none (the file holds no tensors)'}",
            f"  tokenizer: {tokenizer}{_NOT_SUPPORTED if 'tokenizer' in problems else ''}",
            f"  file: GGUF v{contents.version}, {len(contents.tensors)} tensors, {len(meta)} metadata keys, "
            f"{size_text}"]


def _model_problems(contents: GGUFContents) -> dict[str, str]:
    """{"architecture" | "types": why scratchlm cannot load it}, from the header alone (cheap checks)."""
    from scratchlm.interop.gguf.model_load import gguf_model_config
    from scratchlm.interop.gguf.tensor_names import hf_name

    problems = {}
    try:
        gguf_model_config(contents)
        for name in contents.tensors:
            hf_name(name)
    except (ValueError, KeyError) as exc:
        problems["architecture"] = str(exc)
    try:
        contents.check_tensor_types()
    except ValueError as exc:
        problems["types"] = str(exc).removeprefix(f"GGUF file {contents.path}: ")
    return problems


def _tokenizer_problem(contents: GGUFContents) -> dict[str, str]:
    from scratchlm.load.tokenizers import gguf_tokenizer

    try:
        gguf_tokenizer(contents.metadata)
    except (ValueError, KeyError) as exc:
        return {"tokenizer": str(exc)}
    return {}


def _gguf_models_lines(path: Path) -> list[str]:
    """What `models` prints for a GGUF file; ValueError naming every problem when scratchlm cannot load it
    (after printing what the header says)."""
    from scratchlm.interop.gguf.reader import read_gguf
    from scratchlm.load import load_pretrained

    contents = read_gguf(path)
    problems = _model_problems(contents)
    if not problems:
        try:
            loaded = load_pretrained(path, keep_quantized=False)
        except ValueError as exc:
            problems["load"] = str(exc)
        else:
            return [loaded.summary(), *gguf_description(contents, problems)]
    problems.update(_tokenizer_problem(contents))
    arch, name = contents.get("general.architecture", "no general.architecture"), contents.get("general.name")
    print(f"gguf {path.name}: {arch}{f' {name!r}' if name else ''}, "
          "not loadable by scratchlm", *gguf_description(contents, problems), sep="\n", flush=True)
    reasons = list(dict.fromkeys(problems.values()))  # a load error may repeat a check's
    raise ValueError(f"{path} cannot be loaded by scratchlm: {'; '.join(reasons)}")


def run_models(args: argparse.Namespace) -> int:
    """Load each model and print the line that says what it is (GGUF files: what the file holds, too)."""
    from scratchlm.load import load_pretrained, model_kind

    for path in args.paths:
        kind, resolved = model_kind(path)
        if kind == "gguf":
            print(*_gguf_models_lines(resolved), sep="\n", flush=True)
        else:
            print(load_pretrained(path, keep_quantized=False).summary(), flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="a preset's or a loaded model's params, FLOPs/token and forward speed")
    p.add_argument("--preset", default="llama-small", help="preset name (see `scratchlm presets`)")
    p.add_argument("--checkpoint", metavar="PATH", default=None,
                   help="report on this model instead (scratchlm checkpoint dir, HF model dir or .gguf file)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=run_info)
    p = sub.add_parser("presets", help="list the model presets")
    p.set_defaults(func=run_presets)
    p = sub.add_parser("models", help="say what each model path holds: kind, family, params, dtype, context, template")
    p.add_argument("paths", nargs="+", metavar="PATH", help="scratchlm checkpoint dir, HF model dir or .gguf file")
    p.set_defaults(func=run_models)
