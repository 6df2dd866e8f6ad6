// Causal attention scores of bf16 q and k by AVX512-BF16 dot products, fused with causal_softmax.h's row work
// (nn/probs_attention.py's forward and backward on CPUs with vdpbf16ps):
//
//   forward    P[r, :]  = causal softmax of c (q_r . k_j)          (q_r . k_j in fp32: exact bf16 products)
//   backward   dS[r, :] = c P[r, :] (dO_r . v_j - D[r])            (the same dot products, dO and v)
//
// Per head group n: a (M, Hd) bf16 rows (query or dO rows; row r's position is r % T), b (T, Hd) bf16 (keys or
// values). b is first packed in d-pairs, bp[d / 2][j] = (b[j, d], b[j, d + 1]), so one 64-byte load holds 16
// keys' pairs and vdpbf16ps adds a[r, d] b[j, d] + a[r, d + 1] b[j, d + 1] to 16 fp32 lanes (keys j .. j + 15).
// A tile is 4 rows x 64 keys (16 accumulators), keys only up to the tile's last row position (the causal half).
// The products are exact in fp32 and summed in fp32 (in pairs: the order differs from a GEMM's, not the
// precision); the row work is causal_softmax.h's. Replaces an fp32 GEMM per head, the gather of its outputs and
// the softmax's read of them (benchmarks/RESULTS.md, issue #26).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "causal_softmax.h"

namespace scratchlm {

#if defined(__AVX512BF16__) && defined(SCRATCHLM_AVX512)
constexpr bool HAS_BF16_DOT = true;

constexpr int SCORE_ROWS = 4, SCORE_KEYS = 64;

// bp (Hd / 2, T16, 2): b (T, Hd) in d-pairs, keys padded with zeros to T16 (a multiple of 16)
inline void pack_pairs(const uint16_t* b, int64_t T, int64_t Hd, int64_t T16, uint32_t* bp) {
  std::fill(bp, bp + Hd / 2 * T16, 0u);
  for (int64_t j = 0; j < T; ++j)
    for (int64_t d = 0; d < Hd; d += 2)
      bp[d / 2 * T16 + j] = static_cast<uint32_t>(b[j * Hd + d]) | (static_cast<uint32_t>(b[j * Hd + d + 1]) << 16);
}

// s[i][j] = a_{r0 + i} . b_j for i < rows (<= SCORE_ROWS) and keys j < nkeys (a multiple of 16, <= T16)
inline void score_rows(const uint16_t* a, int64_t Hd, const uint32_t* bp, int64_t T16, int rows, int64_t nkeys,
                       float* s, int64_t ld) {
  for (int64_t j0 = 0; j0 < nkeys; j0 += SCORE_KEYS) {
    const int nb = static_cast<int>(std::min<int64_t>(SCORE_KEYS, nkeys - j0) / 16);
    __m512 acc[SCORE_ROWS][SCORE_KEYS / 16];
    for (int i = 0; i < SCORE_ROWS; ++i)
      for (int b = 0; b < SCORE_KEYS / 16; ++b) acc[i][b] = _mm512_setzero_ps();
    for (int64_t d = 0; d < Hd / 2; ++d) {
      const uint32_t* row = bp + d * T16 + j0;
      __m512bh kb[SCORE_KEYS / 16];
      for (int b = 0; b < nb; ++b) kb[b] = (__m512bh)_mm512_loadu_si512(row + 16 * b);
      for (int i = 0; i < rows; ++i) {
        uint32_t pair;
        std::memcpy(&pair, a + i * Hd + 2 * d, 4);
        const __m512bh qb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        for (int b = 0; b < nb; ++b) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], qb, kb[b]);
      }
    }
    for (int i = 0; i < rows; ++i)
      for (int b = 0; b < nb; ++b) _mm512_storeu_ps(s + i * ld + j0 + 16 * b, acc[i][b]);
  }
}

// Over N head groups: a (N, M, Hd), b (N, T, Hd) bf16; row r of group n ends at key r % T. fn(n, r, s_row, keys)
// gets each row's fp32 scores s_row[0 .. keys) (keys = r % T + 1), on the thread that computed them.
template <typename Fn>
void causal_scores(const uint16_t* a, const uint16_t* b, int64_t N, int64_t M, int64_t T, int64_t Hd, const Fn& fn) {
  const int64_t T16 = (T + 15) / 16 * 16, tiles = (M + SCORE_ROWS - 1) / SCORE_ROWS;
  std::vector<uint32_t> packed(N * (Hd / 2) * T16);
  at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) pack_pairs(b + n * T * Hd, T, Hd, T16, packed.data() + n * (Hd / 2) * T16);
  });
  at::parallel_for(0, N * tiles, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> s(SCORE_ROWS * T16);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / tiles, r0 = i % tiles * SCORE_ROWS;
      const int rows = static_cast<int>(std::min<int64_t>(SCORE_ROWS, M - r0));
      int64_t last = 0;  // the tile's furthest key
      for (int k = 0; k < rows; ++k) last = std::max(last, (r0 + k) % T);
      score_rows(a + (n * M + r0) * Hd, Hd, packed.data() + n * (Hd / 2) * T16, T16, rows, (last + 16) / 16 * 16,
                 s.data(), T16);
      for (int k = 0; k < rows; ++k) fn(n, r0 + k, s.data() + k * T16, (r0 + k) % T + 1);
    }
  });
}

// P (N, M, T) bf16 = causal softmax of c (q . k): causal_softmax_rows's row on the fused scores
inline void causal_probs(const uint16_t* q, const uint16_t* k, uint16_t* p, int64_t N, int64_t M, int64_t T,
                         int64_t Hd, float c) {
  causal_scores(q, k, N, M, T, Hd, [&](int64_t n, int64_t r, float* s, int64_t keys) {
    softmax_row_bf16(s, keys, c, p + (n * M + r) * T, T);
  });
}

// dS (N, M, T) bf16 = c P (dO . v - D): causal_softmax_grad_rows's row on the fused products
inline void causal_probs_grad(const uint16_t* p, const uint16_t* dout, const uint16_t* v, const float* d, uint16_t* ds,
                              int64_t N, int64_t M, int64_t T, int64_t Hd, float c) {
  causal_scores(dout, v, N, M, T, Hd, [&](int64_t n, int64_t r, float* dp, int64_t keys) {
    const int64_t row = n * M + r;
    softmax_grad_row_bf16(p + row * T, dp, d[row], keys, c, ds + row * T, T);
  });
}
#else
constexpr bool HAS_BF16_DOT = false;
#endif

}  // namespace scratchlm
