"""The CPU's fp32 FMA peak, measured: the ceiling of any exact (fp32-activation) prompt GEMM on this machine.

A C++ loop of independent vector FMA chains (accumulators of the widest vector the compiler targets with
-march=native: 16 of 16 floats under AVX-512, 12 of 8 floats under AVX2, whose 16 registers hold no more), no
loads, one std::thread per requested thread, best of 5; compiled once into a temporary directory with the
system's C++ compiler (the one torch's extension build uses).
Peak GFLOP/s = 2 * lanes * accumulators * iterations * threads / seconds.

An exact prefill of a model whose layers hold F GFLOP of matrix products per token cannot pass peak / F tokens per
second (gguf_decode.py reports that ceiling beside each engine's prefill); an int8 prompt (llama.cpp's Q8
activations, scratchlm's a8 mode) can.
    python benchmarks/fma_peak.py [--threads 2]     # prints {"threads": 2, "fma_peak_gflop_s": ...}
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <immintrin.h>

#if defined(__AVX512F__)
typedef __m512 V;
static const int LANES = 16;
#define CHAINS 16
static inline V vset(float a) { return _mm512_set1_ps(a); }
static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(V a) { return _mm512_reduce_add_ps(a); }
#else
typedef __m256 V;
static const int LANES = 8;
#define CHAINS 12  // 16 ymm registers: 12 chains + the two operands (16 chains spilled: a store-bound loop)
static inline V vset(float a) { return _mm256_set1_ps(a); }
static inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vsum(V a) { float t[8]; _mm256_storeu_ps(t, a); float s = 0; for (float v : t) s += v; return s; }
#endif

static float chains(long iters) {
  V acc[CHAINS];
  for (int i = 0; i < CHAINS; ++i) acc[i] = vset(0.001f * i);
  const V a = vset(0.999999f), b = vset(1e-7f);
  for (long n = 0; n < iters; ++n)
#pragma GCC unroll 16
    for (int i = 0; i < CHAINS; ++i) acc[i] = vfma(acc[i], a, b);
  float s = 0;
  for (int i = 0; i < CHAINS; ++i) s += vsum(acc[i]);
  return s;
}

int main(int argc, char** argv) {
  const int threads = std::atoi(argv[1]);
  const long iters = 20000000;
  double best = 0;
  volatile float sink = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> pool;
    std::vector<float> out(threads);
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { out[t] = chains(iters); });
    for (auto& p : pool) p.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (float v : out) sink = sink + v;
    double gflop = 2.0 * LANES * CHAINS * iters * threads / 1e9;
    if (gflop / s > best) best = gflop / s;
  }
  std::printf("%.1f\n", best);
  return 0;
}
"""


def fma_peak_gflop_s(threads: int = 2) -> float | None:
    """The measured fp32 FMA peak of `threads` threads in GFLOP/s (None without a C++ compiler)."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fma.cpp", Path(tmp) / "fma"
        src.write_text(SOURCE)
        subprocess.run([cxx, "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True,
                       capture_output=True)
        out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    print(json.dumps({"threads": args.threads, "fma_peak_gflop_s": fma_peak_gflop_s(args.threads)}))


if __name__ == "__main__":
    main()
