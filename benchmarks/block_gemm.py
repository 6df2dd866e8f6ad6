"""A prompt's matrix product on ggml blocks: GFLOP/s by batch rows, ours against torch's GEMM on fp32 weights.

For each block type (--types) and a 1B model's two FFN shapes (N x K = 8192 x 2048, 2048 x 8192), and each
batch size B (--rows): ours is `ops.linear_blocks` on B fp32 rows (what BlockLinear runs up to 512 rows:
gemv.h's passes of 8 rows up to 8, block_gemm.h's blocked GEMM from 9: W widened exactly once per call);
"tiles" is the path BlockLinear takes past 512 rows (4 MiB row tiles widened by the kernels, then torch's
GEMM, quant/block_matmul.py); the peer is torch's fp32 GEMM on the already dequantized matrix (x @ W^T with W
fp32 in memory: the same FLOPs without any widening, oneDNN/MKL's blocking). The blocks are llama.cpp's
quantization of 64 Gaussian rows, tiled to N. Each of --repeats rounds waits for a quiet machine
(benchmarks/quiet.py) and times them back to back; each keeps its best round. ratio = ours / peer. From 64 rows
ours runs one level of Strassen-Winograd (7/8 of the FMAs; GFLOP/s count the plain product's FLOPs):
"plain" is ours with it switched off (set_strassen(False)), timed in the same rounds.
Prints one JSON object:
  {"types": {T: {"NxK": {"B": {"ours_gflop_s", "plain_gflop_s", "tiles_gflop_s", "torch_fp32_gflop_s", "ratio"}}}},
   "threads", "simd", "torch", "quiet": {...}}
    python benchmarks/block_gemm.py [--types Q4_K,Q6_K] [--rows 8,16,32,64,128,256] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_types import matrix  # noqa: E402
from quiet import wait_quiet  # noqa: E402

from scratchlm.kernels import ops  # noqa: E402
from scratchlm.kernels.build import native  # noqa: E402
from scratchlm.quant.block_matmul import block_linear  # noqa: E402
from scratchlm.quant.dequantize import dequantize_blocks  # noqa: E402

SHAPES = ((8192, 2048), (2048, 8192))


def best_s(fn, calls: int = 3) -> float:
    """Best seconds of `calls` calls of fn (after one untimed call)."""
    fn()
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def plain(mod, x: torch.Tensor, w) -> torch.Tensor:
    """ops.linear_blocks with the Strassen-Winograd level switched off."""
    before = mod.set_strassen(False)
    try:
        return ops.linear_blocks(mod, x, w)
    finally:
        mod.set_strassen(before)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_K,Q6_K,Q5_0", help="comma-separated block types")
    p.add_argument("--rows", default="8,16,32,64,128,256", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quiet-timeout", type=float, default=120.0)
    args = p.parse_args()
    mod = native()
    if mod is None:
        sys.exit("block_gemm.py: no C++ kernels on this machine (a compiler is needed)")
    torch.set_num_threads(args.threads)
    widen = lambda b, out=None: ops.dequantize(mod, b, out)  # noqa: E731 (BlockLinear's own widening)
    quiet: dict = {}
    out: dict = {}
    for t in args.types.split(","):
        for n, k in SHAPES:
            w = matrix(t, n, k)
            dense = dequantize_blocks(w)
            row = out.setdefault(t, {}).setdefault(f"{n}x{k}", {})
            for b in (int(v) for v in args.rows.split(",")):
                x = torch.randn(b, k)
                flop = 2.0 * n * k * b / 1e9
                best = {"ours": float("inf"), "plain": float("inf"), "tiles": float("inf"), "torch": float("inf")}
                for _ in range(args.repeats):
                    wait_quiet(timeout_s=args.quiet_timeout, stats=quiet)
                    best["ours"] = min(best["ours"], best_s(lambda: ops.linear_blocks(mod, x, w)))
                    best["plain"] = min(best["plain"], best_s(lambda: plain(mod, x, w)))
                    best["tiles"] = min(best["tiles"], best_s(lambda: block_linear(x, w, None, widen)))
                    best["torch"] = min(best["torch"], best_s(lambda: x @ dense.T))
                row[str(b)] = {"ours_gflop_s": round(flop / best["ours"], 1),
                               "plain_gflop_s": round(flop / best["plain"], 1),
                               "tiles_gflop_s": round(flop / best["tiles"], 1),
                               "torch_fp32_gflop_s": round(flop / best["torch"], 1),
                               "ratio": round(best["torch"] / best["ours"], 3)}
                print(f"{t} {n}x{k} B={b}: {row[str(b)]}", file=sys.stderr, flush=True)
    print(json.dumps({"types": out, "threads": args.threads, "simd": mod.simd(), "torch": torch.__version__,
                      "quiet": quiet}))


if __name__ == "__main__":
    main()
