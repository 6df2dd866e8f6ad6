"""The exact decode kernels of every ggml type: GB/s of weight bytes read at batch 1, against a plain reduction.

For each type (F32, F16, BF16 and every block type quant/dequantize.py reads) and two decode-sized matrices
(N x K = 2048 x 8192, a down projection's long rows, and 8192 x 2048), ours is `ops.linear_blocks` on one
fp32 row (the kernel `decode="fast-gguf"` runs per matrix: W widened exactly, fp32 FMAs) and, for the block
types, its A8 row form (`a8=True`: x rounded to 8 bits per block, integer dot products; the "gguf_a8"
format) as ours_a8_gb_s, and gemv.h's widening with the centered kernels switched off (`set_centered(False)`:
for the types kernels/csrc/gemv_centered.h takes at batch 1, what they replace; the same kernel for the rest)
as ours_widened_gb_s; the peer is the
machine's read rate for the same number of bytes: torch.sum over a float32 buffer of that size. The blocks
are llama.cpp's quantization of a Gaussian matrix (64 rows quantized, tiled to N: the speed does not depend
on the values); enough copies are made that one round reads > --mb MB (the L3 cache never holds them, so
every call streams from DRAM as a decode step does), and each round calls every copy once, ours and the
reduction alike. Both on --threads threads. Each of --repeats rounds waits for a quiet machine first
(benchmarks/quiet.py), then times the reduction, ours and ours A8 back to back; each keeps its best round;
ratio = ours / reduction GB/s, same run.
Prints one JSON object:
  {"types": {T: {"2048x8192": {"ours_gb_s", "sum_gb_s", "ratio", "us_per_call", "ours_a8_gb_s", "ratio_a8",
   "ours_widened_gb_s", "centered_over_widened"},
   "8192x2048": {...}, "ratio_min"}}, "threads", "simd", "torch", "quiet": {...}}
    python benchmarks/gemv_types.py [--types Q4_K,Q6_K] [--repeats 5] [--mb 192] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "quant"))

from quiet import wait_quiet  # noqa: E402

from scratchlm.kernels import ops  # noqa: E402
from scratchlm.quant.blocks import GGMLBlocks  # noqa: E402
from scratchlm.quant.dequantize import KERNEL_TYPES  # noqa: E402

SHAPES = ((2048, 8192), (8192, 2048))
DENSE = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def matrix(type_name: str, n: int, k: int) -> GGMLBlocks:
    """An (n, k) matrix in type_name: 64 Gaussian rows (llama.cpp's quantizer for block types), tiled."""
    w = np.random.default_rng(0).standard_normal((64, k)).astype(np.float32)
    if type_name in DENSE:
        rows = torch.from_numpy(w).to(DENSE[type_name]).view(torch.uint8)
    else:
        from ggml_c_lib import quantize  # tests/quant: llama.cpp's ggml_quantize_chunk through ctypes
        rows = torch.from_numpy(quantize(w, type_name))
    return GGMLBlocks(type_name, rows.repeat(n // 64, 1).contiguous(), (n, k))


QUIET_TIMEOUT_S = [60.0]  # --quiet-timeout


def round_s(fn, items: list) -> float:
    """Seconds per item of one round: fn(item) for every item."""
    t0 = time.perf_counter()
    for it in items:
        fn(it)
    return (time.perf_counter() - t0) / len(items)


def measure(mod, type_name: str, n: int, k: int, target_mb: float, repeats: int, stats: dict) -> dict:
    """Best of `repeats` rounds of each of: the reduction, ours exact, ours A8 and ours widened (block types),
    interleaved round by round after a quiet wait, so a busy spell hits them alike."""
    one = matrix(type_name, n, k)
    nbytes = one.data.numel()
    copies = max(2, int(target_mb * 2**20 // nbytes) + 1)
    mats = [one] + [GGMLBlocks(type_name, one.data.clone(), one.shape) for _ in range(copies - 1)]
    sums = [torch.ones(nbytes // 4) for _ in range(copies)]
    x = torch.randn(1, k)
    runs = {"sum": lambda b: b.sum(), "ours": lambda m: ops.linear_blocks(mod, x, m)}
    if type_name not in DENSE:
        runs["a8"] = lambda m: ops.linear_blocks(mod, x, m, a8=True)
        runs["widened"] = lambda m: widened(mod, x, m)
    for name, fn in runs.items():  # warm: first touch, thread pool
        fn(sums[0] if name == "sum" else mats[0])
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        wait_quiet(timeout_s=QUIET_TIMEOUT_S[0], stats=stats)
        for name, fn in runs.items():
            best[name] = min(best[name], round_s(fn, sums if name == "sum" else mats))
    peer = nbytes / best["sum"] / 1e9
    ours = nbytes / best["ours"] / 1e9
    row = {"ours_gb_s": round(ours, 2), "sum_gb_s": round(peer, 2), "ratio": round(ours / peer, 3),
           "us_per_call": round(best["ours"] * 1e6, 1), "mb": round(nbytes / 2**20, 2)}
    if "a8" in best:
        a8 = nbytes / best["a8"] / 1e9
        row.update(ours_a8_gb_s=round(a8, 2), ratio_a8=round(a8 / peer, 3), a8_us_per_call=round(best["a8"] * 1e6, 1))
        wide = nbytes / best["widened"] / 1e9
        row.update(ours_widened_gb_s=round(wide, 2), centered_over_widened=round(ours / wide, 3))
    return row


def widened(mod, x: torch.Tensor, m: GGMLBlocks) -> torch.Tensor:
    """ops.linear_blocks with gemv_centered.h switched off (gemv.h's widening for every type)."""
    mod.set_centered(False)
    try:
        return ops.linear_blocks(mod, x, m)
    finally:
        mod.set_centered(True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=",".join(KERNEL_TYPES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mb", type=float, default=192.0, help="bytes read per round (beyond the L3 cache)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet-timeout", type=float, default=60.0, help="seconds to wait for quiet before each round")
    args = ap.parse_args()
    QUIET_TIMEOUT_S[0] = args.quiet_timeout
    torch.set_num_threads(args.threads)
    mod = ops.native_kernels()
    if mod is None:
        sys.exit("the C++ kernels are not available (SCRATCHLM_KERNELS=0 or no compiler)")
    stats: dict = {}
    out: dict = {}
    t0 = time.time()
    for t in args.types.split(","):
        row = {f"{n}x{k}": measure(mod, t, n, k, args.mb, args.repeats, stats) for n, k in SHAPES}
        row["ratio_min"] = min(v["ratio"] for v in row.values())
        if t not in DENSE:
            row["ratio_a8_min"] = min(v["ratio_a8"] for k, v in row.items() if k != "ratio_min")
        out[t] = row
        print(t, json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"types": out, "threads": args.threads, "simd": mod.simd(), "torch": torch.__version__,
                      "quiet": stats, "total_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
