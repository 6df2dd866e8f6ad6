"""Benchmark: loading and saving an HF checkpoint with scratchlm vs transformers, side by side.

    python benchmarks/interop_load_save.py [--family llama|gpt2] [--repeats 3] [--shard-size 20MB] [--threads 1]

Builds a random-weight HF model of the llama-small shape (vocab 8192, 6 layers, D 384, 6 heads, 2 KV
heads, d_ff 1024) or GPT-2 small-ish (vocab 8192, 6 layers, D 384), saves it sharded, then times
  load: scratchlm.from_pretrained(dir)  vs  AutoModelForCausalLM.from_pretrained(dir)
  save: scratchlm.save_pretrained(...)  vs  model.save_pretrained(...)
(median of --repeats) and prints ONE JSON object with the ratios (ours / transformers; < 1 = faster)
and the max |logit diff| of the two loaded models as a check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import scratchlm


def build(family: str) -> torch.nn.Module:
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_embd=384, n_layer=6, n_head=6, n_positions=512))
    return LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                                        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512))


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("llama", "gpt2"), default="llama")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard-size", default="20MB")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a loaded 2-core machine, 2 threads stall ~50 ms per copy)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf = build(args.family).eval()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        hf.save_pretrained(src, max_shard_size=args.shard_size)
        ours = scratchlm.from_pretrained(src)
        load_ours = median_time(lambda: scratchlm.from_pretrained(src), args.repeats)
        load_hf = median_time(lambda: AutoModelForCausalLM.from_pretrained(src), args.repeats)
        save_ours = median_time(
            lambda: scratchlm.save_pretrained(ours, Path(tmp) / "ours", max_shard_size=args.shard_size), args.repeats)
        save_hf = median_time(lambda: hf.save_pretrained(Path(tmp) / "hf", max_shard_size=args.shard_size), args.repeats)
        n_shards = len(list(src.glob("model-*.safetensors")))
    ids = torch.randint(0, 8192, (2, 64))
    with torch.no_grad():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
    print(json.dumps({
        "benchmark": "interop_load_save", "family": args.family, "torch": torch.__version__, "threads": args.threads,
        "params": sum(p.numel() for p in ours.parameters()), "shards": n_shards, "repeats": args.repeats,
        "load_s": {"scratchlm": round(load_ours, 3), "transformers": round(load_hf, 3),
                   "ratio": round(load_ours / load_hf, 2)},
        "save_s": {"scratchlm": round(save_ours, 3), "transformers": round(save_hf, 3),
                   "ratio": round(save_ours / save_hf, 2)},
        "max_abs_logit_diff": diff,
    }))


if __name__ == "__main__":
    main()
