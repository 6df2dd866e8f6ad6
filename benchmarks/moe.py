"""Benchmark: one mixture-of-experts FFN, scratchlm's dense reference and grouped path vs transformers' block.

    python benchmarks/moe.py [--experts 32] [--top-k 4] [--d-model 1024] [--d-ff 256] [--threads 2]

A Qwen3-MoE-shaped sparse block (router softmax -> top-k -> renormalise, SwiGLU experts) with random
weights, built once as transformers' `Qwen3MoeSparseMoeBlock` and copied into `scratchlm.nn.moe.MoE`. For
N = 1 and 16 tokens (decoding a batch) and 512 (a prompt) it times, median of --repeats after a quiet
machine (benchmarks/quiet.py):
  reference   scratchlm, every expert on every token (the definition; E / k times the sparse compute)
  grouped     scratchlm's fast path: tokens sorted by expert, each expert once on its rows
  hf_eager    transformers' default experts loop (experts_implementation "eager")
  hf_<impl>   transformers' batched_mm / grouped_mm implementations where they run on this machine
Prints ONE JSON object: ms per call for each, grouped / hf_eager ratios (< 1 = faster) and the largest
|output difference| of each implementation from transformers' eager block.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from quiet import wait_quiet
from scratchlm.nn.moe import MoE

TOKENS = (1, 16, 512)
HF_IMPLS = ("eager", "batched_mm", "grouped_mm")


def build(args: argparse.Namespace) -> tuple[Qwen3MoeSparseMoeBlock, dict[str, MoE]]:
    config = Qwen3MoeConfig(hidden_size=args.d_model, num_attention_heads=8, moe_intermediate_size=args.d_ff,
                            num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True)
    hf = Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.05)
    ours = {}
    for impl in ("reference", "grouped"):
        moe = MoE(args.d_model, args.d_ff, args.experts, args.top_k, "softmax_topk", True, impl=impl).eval()
        with torch.no_grad():
            moe.gate.weight.copy_(hf.gate.weight)
            f = args.d_ff
            moe.experts.gate_proj.copy_(hf.experts.gate_up_proj[:, :f])
            moe.experts.up_proj.copy_(hf.experts.gate_up_proj[:, f:])
            moe.experts.down_proj.copy_(hf.experts.down_proj)
        ours[impl] = moe
    return hf, ours


def hf_call(hf: Qwen3MoeSparseMoeBlock, impl: str):
    def run(x: torch.Tensor) -> torch.Tensor:
        hf.experts.config._experts_implementation = impl
        out = hf(x)
        return out[0] if isinstance(out, tuple) else out
    return run


def median_ms(fn, x: torch.Tensor, repeats: int, min_s: float = 0.3) -> float:
    """Median over `repeats` windows of >= min_s seconds each of the time per call, in ms."""
    fn(x)
    per_call = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t0 < min_s:
            fn(x)
            n += 1
        per_call.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(per_call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--d-ff", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf, ours = build(args)
    calls = {name: moe for name, moe in ours.items()}
    calls.update({f"hf_{impl}": hf_call(hf, impl) for impl in HF_IMPLS})
    results, diffs, stats = {}, {}, {}
    with torch.no_grad():
        for n in TOKENS:
            x = torch.randn(1, n, args.d_model)
            expected = calls["hf_eager"](x)
            row = {}
            for name, fn in calls.items():
                try:
                    diffs[name] = max(diffs.get(name, 0.0), (fn(x) - expected).abs().max().item())
                except (RuntimeError, NotImplementedError) as err:  # an HF kernel this machine lacks
                    row[name] = f"unavailable: {str(err).splitlines()[0][:80]}"
                    continue
                wait_quiet(stats=stats)
                row[name] = round(median_ms(fn, x, args.repeats), 3)
            row["grouped_over_hf_eager"] = round(row["grouped"] / row["hf_eager"], 2)
            row["grouped_over_reference"] = round(row["grouped"] / row["reference"], 2)
            results[f"tokens_{n}"] = row
    print(json.dumps({
        "benchmark": "moe", "torch": torch.__version__, "threads": args.threads,
        "shape": {"d_model": args.d_model, "d_ff": args.d_ff, "experts": args.experts, "top_k": args.top_k},
        "ms_per_call": results, "max_abs_diff_vs_hf_eager": {k: float(f"{v:.2e}") for k, v in diffs.items()},
        "quiet": stats,
    }))


if __name__ == "__main__":
    main()
