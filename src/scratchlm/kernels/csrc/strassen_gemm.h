// One level of Strassen-Winograd (Winograd's form: 7 products, 15 additions) inside the prompt GEMM of
// block_gemm.h: 2 x 2 x 2 blocks of (tokens, K, weight rows) whose eight block products become seven, so that a
// prompt's GEMM does 7/8 of the FMAs. The x side's sums are formed once per call (PackedX::sums), the W side's on
// the widened slices (sub_block), the outputs' combinations once per row block.
//
// Zen 4 (2-core VM), one thread, Q4_K 128 tokens, the two alternated in one process: 3B-shaped 3072 x 3072
// +5-7%, 16384 x 3072 +6-7%, 3072 x 8192 +-2% (its x and x's sums, 4 MB each, stream from L3 for every row block);
// Zen 3 (AVX2: pairs of 6-row groups, one tile per micro-kernel call), whole 128-token prompts: 1B Q4_K_M +12%, 3B
// +11%; benchmarks/RESULTS.md.

#pragma once

#include <algorithm>
#include <cstdint>

#include "aligned_buffer.h"
#include "gemm_micro.h"
#include "weight_rows.h"

namespace scratchlm {

// out = a - b over R rows of SW_HALF values (a, b: ld lda, ldb; out: ld SW_HALF)
inline void sub_block(const float* a, int64_t lda, const float* b, int64_t ldb, float* out) {
  for (int r = 0; r < GEMM_R; ++r)
    for (int64_t e = 0; e < SW_HALF; e += 16)
      vstore(out + r * SW_HALF + e, vsub(vload(a + r * lda + e), vload(b + r * ldb + e)));
}

// c_a += the slice (kc columns of R rows at w, ld ldw) times tile xa, c_b the same times xb: two tiles per
// broadcast weight on AVX-512 (gemm_micro2), one tile at a time elsewhere (AVX2's 16 registers hold one tile's)
template <int R, int64_t KC>
inline void gemm_micro_pair(const float* w, int64_t ldw, const float* xa, const float* xb, int64_t kc, float* ca,
                            float* cb) {
#if defined(SCRATCHLM_AVX512)
  gemm_micro2<R, KC>(w, ldw, xa, xb, kc, ca, cb);
#else
  gemm_micro<R, KC>(w, ldw, xa, kc, ca);
  gemm_micro<R, KC>(w, ldw, xb, kc, cb);
#endif
}

// One level of Strassen-Winograd on the first `pairs` pairs of R-row groups of a row block (its first row: row0 of
// src), for the packed tokens' first xp.units units of four tiles (64 token slots): per (pair, unit, SW_K-column
// chunk) the 2 x 2 x 2 block product C = A B (A: the unit's tokens x the chunk's columns, halves of 32 tokens and
// SW_HALF columns; B = W^T: the chunk x the pair, halves of SW_HALF columns and R rows) in 7 micro-kernel products
// instead of 8:
//   T1 = B12 - B11, T2 = B22 - T1, T3 = B22 - B12, T4 = T2 - B21 (the W side, on the widened slices)
//   P1 = A11 B11, P2 = A12 B21, P3 = S4 B22, P4 = A22 T4, P5 = S1 T1, P6 = S2 T2, P7 = S3 T3 (S: PackedX)
//   C11 = P1 + P2, C12 = P1 + P6 + P5 + P3, C21 = P1 + P6 + P7 - P4, C22 = P1 + P6 + P7 + P5
// Each P sums over the chunks in order; the C's are formed once at the end into `sums` (row group, tile, R, 16).
// Both rows groups' slices are widened once (B11 | B21 side by side, B12 | B22: 24 KB) and the T's formed one at a
// time in a third block (6 KB): every W value is still widened once per call, and the tiles past the units take
// the plain micro-kernels on the same slices. 12.5% fewer FMAs for 4 half-slice subtractions per pair and chunk
// (x's S: once per call). Rounding: the P's sum differences of weights and of x values, each token's x scaled to
// a largest |value| in [0.5, 1) first (PackedX) so that no token's error grows with another's scale; a few more
// fp32 roundings per output than the plain order (tests/kernels/test_strassen.py: within the same fp32 bound).
template <typename Block>
inline void strassen_rows(const PackedX& xp, const WeightRows<Block>& src, int64_t row0, int64_t pairs, float* sums,
                          FloatBuf& prods, FloatBuf& wq) {
  constexpr int R = GEMM_R;
  constexpr int64_t KC = SW_HALF, NT = GEMM_NT, P = 2 * R * NT;  // P: one product's floats
  const int64_t K = xp.K, tiles = xp.tiles, units = xp.units;
  const size_t need = static_cast<size_t>(pairs * units * 7 * P);
  if (prods.size() < need) prods.resize(need);
  std::fill(prods.begin(), prods.begin() + need, 0.0f);
  constexpr int64_t L = GEMM_KC;  // the widened slices' row stride: B11 | B21 side by side, B12 | B22
  if (wq.size() < static_cast<size_t>(2 * R * L + R * KC)) wq.resize(2 * R * L + R * KC);
  float *wa = wq.data(), *wb2 = wa + R * L, *tw = wb2 + R * L;
  const float *b11 = wa, *b21 = wa + KC, *b12 = wb2, *b22 = wb2 + KC;
  auto prod = [&](int64_t p, int64_t u, int i) { return prods.data() + ((p * units + u) * 7 + i) * P; };
  auto group = [&](int64_t gi, int64_t j) { return sums + (gi * tiles + j) * R * NT; };
  for (int64_t c = 0; c < xp.chunks; ++c) {
    const int64_t k0 = c * SW_K, k1 = k0 + KC;
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t w0 = row0 + 2 * p * R;  // the pair's first R rows; its second R from w0 + R
      src.widen(w0, R, k0, SW_K, wa);
      src.widen(w0 + R, R, k0, SW_K, wb2);
      {  // the next pair's bytes (or the first pair's of the next chunk) while this pair's products run
        const int64_t np = p + 1 < pairs ? p + 1 : 0, nk = p + 1 < pairs ? k0 : k0 + SW_K;
        if (nk < K) src.prefetch(row0 + 2 * np * R, 2 * R, nk, SW_K);
      }
      for (int64_t j = units * 4; j < tiles; j += 2) {  // the tokens past the units: the plain micro-kernels
        const float* xt = xp.t + (j * K + k0) * NT;
        for (int q = 0; q < 2; ++q) {
          float* cg = group(2 * p + q, j);
          if (j + 1 < tiles)
            gemm_micro_pair<R, SW_K>(q ? wb2 : wa, L, xt, xt + K * NT, SW_K, cg, cg + R * NT);
          else
            gemm_micro<R, SW_K>(q ? wb2 : wa, L, xt, SW_K, cg);
        }
      }
      // P_i += (x's two tiles from xa, `step` apart; the next unit's `per_unit` further) . wv, for every unit
      auto run = [&](const float* wv, int64_t ldw, int i, const float* xa, int64_t step, int64_t per_unit) {
        for (int64_t u = 0; u < units; ++u, xa += per_unit) {
          float* pc = prod(p, u, i);
          gemm_micro_pair<R, KC>(wv, ldw, xa, xa + step, KC, pc, pc + R * NT);
        }
      };
      const float* a0 = xp.t + k0 * NT;  // unit 0's A11 (A12 at + KC * NT; A21 2 tiles on, at + 2 * K * NT)
      const float* s0 = xp.s.data() + c * 8 * KC * NT;  // unit 0's S1 of this chunk (S_{i+1} at + 2 i KC * NT)
      const int64_t a_step = K * NT, a_unit = 4 * K * NT, s_step = KC * NT, s_unit = xp.chunks * 8 * KC * NT;
      run(b11, L, 0, a0, a_step, a_unit);                            // P1 = A11 B11
      run(b21, L, 1, a0 + KC * NT, a_step, a_unit);                  // P2 = A12 B21
      run(b22, L, 2, s0 + 6 * s_step, s_step, s_unit);               // P3 = S4 B22
      sub_block(b12, L, b11, L, tw);                                 // T1
      run(tw, KC, 4, s0, s_step, s_unit);                            // P5 = S1 T1
      sub_block(b22, L, tw, KC, tw);                                 // T2
      run(tw, KC, 5, s0 + 2 * s_step, s_step, s_unit);               // P6 = S2 T2
      sub_block(tw, KC, b21, L, tw);                                 // T4
      run(tw, KC, 3, a0 + 2 * a_step + KC * NT, a_step, a_unit);     // P4 = A22 T4
      sub_block(b22, L, b12, L, tw);                                 // T3
      run(tw, KC, 6, s0 + 4 * s_step, s_step, s_unit);               // P7 = S3 T3
    }
  }
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t u = 0; u < units; ++u) {
      const float *p1 = prod(p, u, 0), *p2 = prod(p, u, 1), *p3 = prod(p, u, 2), *p4 = prod(p, u, 3);
      const float *p5 = prod(p, u, 4), *p6 = prod(p, u, 5), *p7 = prod(p, u, 6);
      float *c11 = group(2 * p, 4 * u), *c12 = group(2 * p + 1, 4 * u);
      float *c21 = group(2 * p, 4 * u + 2), *c22 = group(2 * p + 1, 4 * u + 2);
      for (int64_t e = 0; e < P; e += 16) {
        auto ld = [&](const float* a) { return vload(a + e); };
        const VF u2 = vadd(ld(p1), ld(p6)), u3 = vadd(u2, ld(p7));
        vstore(c11 + e, vadd(ld(p1), ld(p2)));
        vstore(c12 + e, vadd(vadd(u2, ld(p5)), ld(p3)));
        vstore(c21 + e, vsub(u3, ld(p4)));
        vstore(c22 + e, vadd(u3, ld(p5)));
      }
    }
}

}  // namespace scratchlm
