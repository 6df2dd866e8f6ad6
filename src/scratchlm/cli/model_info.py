"""`scratchlm info`, `scratchlm presets` and `scratchlm models`: what a model is, its size and speed.

    scratchlm info --preset llama-small               # a fresh model from a preset
    scratchlm info --checkpoint model.gguf            # a loaded model (scratchlm dir, HF dir or .gguf)
    scratchlm models runs/sft hf/qwen2 model.gguf     # one line per model: kind, family, params, dtype, context, template
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from scratchlm.config import PRESETS, get_preset
from scratchlm.model import TransformerLM
from scratchlm.model_stats import model_stats


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


def run_models(args: argparse.Namespace) -> int:
    """Load each model and print the line that says what it is."""
    from scratchlm.load import load_pretrained

    for path in args.paths:
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
