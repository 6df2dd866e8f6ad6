// Prompt-sized products y (B, N) = x (B, K) @ W^T with W in ggml blocks, for B past a few rows: a GEMM on
// blocks widened exactly to fp32, once per call.
//
// gemv.h widens every weight chunk in registers for each pass of up to 8 batch rows, and sums along K in each
// lane (a dot product per (row, token), loads of x and of W for every FMA): at a prompt's 16-128 rows that
// is ~30% of the FMA peak. Here, as in a BLAS GEMM, the work is blocked so that each operand is reused from
// the cache that holds it:
//   x  is packed once per call k-major in tiles of NT = 16 tokens, xt[tile][k][16] (zero-padded tokens);
//   W  is walked in row blocks of MC rows; for each KC-column slice, one group of R rows at a time is widened into
//      a scratch block that stays in L1 (the same values as dequantize, bit for bit: blocks.h's chunk), once per
//      call, and multiplied with every token tile of the slice;
//   the micro-kernel keeps R x NT outputs in registers (R = 6 weight rows x 16 tokens = 12 AVX2 registers; 12
//   rows = 12 zmm registers on AVX-512):
//      for each k: acc[r][0:16] += w[r][k] (broadcast) * xt[k][0:16] (two vector loads),
//   accumulating into a (block rows, tiles, NT) scratch across the K slices, stored to y (store_block) once the
//   row block's last slice is done, while its sums are still in L2.
// Every y[t, n] is sum_k x[t, k] w[n, k] in one fixed order (k ascending within a KC slice, the slices' sums
// added in order), whatever the thread split: results do not depend on the number of threads. Without
// Strassen-Winograd (K not a multiple of SW_K, fewer than 49 tokens, or
// set_strassen(False)) they do not depend on the tile, row group or batch size either; with it (strassen_gemm.h:
// from four 16-token tiles, pairs of row groups) a token's sums also depend on the token 32 places from it in its
// unit of four tiles,
// within the same fp32 bound. The order differs from gemv.h's (fp32 rounding only). 2-core Zen 3, Q4_K
// 8192 x 2048: ~100-130 GFLOP/s at 16-128 tokens against gemv.h's ~58 (benchmarks/block_gemm.py, RESULTS.md).
//
// The parts (PackedX, the micro-kernels, widen_slice) are in gemm_micro.h; a8_gemm.h shares store_block.

#pragma once

#include <algorithm>
#include <cstdint>

#include "aligned_buffer.h"
#include "gemm_micro.h"
#include "strassen_gemm.h"
#include "weight_rows.h"

namespace scratchlm {

// The sums scratch of one row block of `rows` rows (groups of R, 16-token tiles, R, 16), room made for a block
// of up to max_rows rows and this block's groups zeroed: the micro-kernels add each slice's sums into it.
template <int R>
inline float* zeroed_sums(FloatBuf& acc, int64_t max_rows, int64_t rows, int64_t tiles) {
  if (acc.size() < static_cast<size_t>(max_rows * tiles * 16)) acc.resize(max_rows * tiles * 16);
  std::fill(acc.begin(), acc.begin() + (rows + R - 1) / R * R * tiles * 16, 0.0f);
  return acc.data();
}

// One row block's sums, laid out (row group of R, 16-token tile, R, 16), into y[b * ldy + n + r] for r < rows,
// b < B, then fin(b, n, n + rows) on each token's new values (the caller's scale / bias / residual, while they are
// in L1). Token by token, 16 rows at a time through a register transpose: each token's values are whole runs of
// y's lines. Group by group instead wrote 48-byte pieces of 16 token rows ldy apart, rows that share L1 sets when
// ldy is a multiple of 1024 floats (1B prompt: ~3.4% of its samples against ~1.5%, standalone +1-2.5%).
static_assert(GEMM_NT == 16, "store_block and a8_gemm.h's tiles are 16 tokens");
template <int R, typename Fin>
inline void store_block(const float* acc, int64_t rows, int64_t tiles, int64_t B, float* y, int64_t ldy, int64_t n,
                        const Fin& fin) {
  auto sum = [&](int64_t r, int64_t j) { return acc + ((r / R) * tiles + j) * R * 16 + (r % R) * 16; };
  for (int64_t j = 0; j < tiles; ++j) {
    const int64_t lanes = std::min<int64_t>(16, B - j * 16);
    int64_t r0 = 0;
#if defined(SCRATCHLM_AVX512)
    for (; r0 + 16 <= rows; r0 += 16) {
      __m512 v[16];
      for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_ps(sum(r0 + i, j));
      transpose16(v);
      for (int64_t l = 0; l < lanes; ++l) _mm512_storeu_ps(y + (j * 16 + l) * ldy + n + r0, v[l]);
    }
#endif
    for (int64_t l = 0; l < lanes; ++l) {
      float* yb = y + (j * 16 + l) * ldy + n;
      for (int64_t r = r0; r < rows; ++r) yb[r] = sum(r, j)[l];
      fin(j * 16 + l, n, n + rows);
    }
  }
}

// y[b * ldy + n] = x[b] . W[n] for n in [n0, n1), every b < xp.B (W: N rows of K values in Block, read as `src`
// holds them: the file's blocks or the repacked copy), then fin(b, lo, hi) on y[b * ldy + lo .. hi) as each row
// block's values land (store_block).
template <typename Block, typename Fin>
void gemm_block_rows(const PackedX& xp, const WeightRows<Block>& src, float* y, int64_t ldy, int64_t n0, int64_t n1,
                     const Fin& fin) {
  const int64_t K = xp.K, tiles = xp.tiles, rows = n1 - n0;
  // one row group's slice widened (12 KB on AVX-512): written just before its micro-kernels read it, it stays in L1
  // (a whole 96-row slice widened at once, 96 KB, went out to L2 and back: 1B-shaped Q4_K 128 tokens +2-3.5%)
  alignas(64) thread_local float wg[GEMM_R * GEMM_KC];
  thread_local FloatBuf acc;  // one row block's (row group, tile, R, NT) partial sums (48 KB at 128 tokens)
  auto prefetch_group = [&](int64_t m0, int64_t g, int64_t k0) {  // group g of row block m0, slice k0 (or the next)
    if (g >= std::min(GEMM_MC, rows - m0)) g = 0, k0 += GEMM_KC;
    if (k0 >= K) k0 = 0, m0 += GEMM_MC;
    if (m0 >= rows) return;
    src.prefetch(n0 + m0 + g, std::min<int64_t>(GEMM_R, rows - m0 - g), k0, std::min(GEMM_KC, K - k0));
  };
  // each token's values back at x's scale (PackedX's power-of-two scaling for Strassen-Winograd), then fin
  auto unscaled = [&](int64_t b, int64_t lo, int64_t hi) {
    if (!xp.up.empty() && xp.up[b] != 1.0f) {
      float* yb = y + b * ldy;
      for (int64_t n = lo; n < hi; ++n) yb[n] *= xp.up[b];
    }
    fin(b, lo, hi);
  };
  for (int64_t m0 = 0; m0 < rows; m0 += GEMM_MC) {
    const int64_t mc = std::min(GEMM_MC, rows - m0);
    float* sums = zeroed_sums<GEMM_R>(acc, GEMM_MC, mc, tiles);
    int64_t g0 = 0;  // the first row group the plain loop below takes
    if (xp.units > 0 && mc >= 2 * GEMM_R) {
      thread_local FloatBuf prods, wq;
      const int64_t pairs = mc / (2 * GEMM_R);
      strassen_rows<Block>(xp, src, n0 + m0, pairs, sums, prods, wq);
      g0 = pairs * 2 * GEMM_R;
    }
    for (int64_t k0 = 0; g0 < mc && k0 < K; k0 += GEMM_KC) {
      const int64_t kc = std::min(GEMM_KC, K - k0);
      for (int64_t g = g0; g < mc; g += GEMM_R) {
        const int r = static_cast<int>(std::min<int64_t>(GEMM_R, mc - g));
        src.widen(n0 + m0 + g, r, k0, kc, wg);
        prefetch_group(m0, g + GEMM_R, k0);  // the next group's bytes (rows row_bytes apart: not a stream the
                                             // hardware prefetcher follows) while this one's micro-kernels run
        for (int64_t j = 0; j < tiles; ++j) {
          const float* xt = xp.t + (j * K + k0) * GEMM_NT;
          float* c = sums + ((g / GEMM_R) * tiles + j) * GEMM_R * GEMM_NT;
#if defined(SCRATCHLM_AVX512)
          if (j + 1 < tiles) {  // two tiles at once
            if (kc == GEMM_KC)
              gemm_micro2_rows<GEMM_KC>(r, wg, GEMM_KC, xt, xt + K * GEMM_NT, kc, c, c + GEMM_R * GEMM_NT);
            else
              gemm_micro2_rows<0>(r, wg, GEMM_KC, xt, xt + K * GEMM_NT, kc, c, c + GEMM_R * GEMM_NT);
            ++j;
            continue;
          }
#endif
          if (kc == GEMM_KC)  // a known trip count: ~1.4x the loop on a runtime one (2-core Zen 3)
            gemm_micro_rows<GEMM_KC>(r, wg, GEMM_KC, xt, kc, c);
          else
            gemm_micro_rows<0>(r, wg, GEMM_KC, xt, kc, c);
        }
      }
    }
    store_block<GEMM_R>(sums, mc, tiles, xp.B, y, ldy, n0 + m0, unscaled);
  }
}

}  // namespace scratchlm
