// Prompt-sized products of the A8 row formats (gemv_a8_blocks.h's definition: x rounded to 8 bits per block of
// the weight type, then y = round(x) W^T) as an int8 GEMM with AVX512-VNNI: what block_gemm.h is to the exact
// path, for B past a few rows.
//
// Per weight block and 16-value group g (w = s_g q + t_g, blocks.h's prepare / quants) and token t:
//   sum_{j in g} w_j (d_t qx_tj) = d_t (s_g isum_tg) + t_g xs_tg,   isum_tg = sum_j q_j qx_tj,  xs_tg = d_t sum_j qx_tj
// isum exact in int32 (vpdpbusd: 4 bytes of q, broadcast, times 16 tokens' 4 bytes of qx: one lane per token);
// then in fp32 per group sb_t += isum_tg s_g, per block acc_t += sb_t d_t, and acc_t += t_g xs_tg. The int8 weights
// (q; q + 128 for the signed types, whose t_g then carries -128 s_g: sum (q + 128) qx = isum + 128 sum qx) are
// unpacked once per call into a slice of rows x 256 columns, as block_gemm.h widens its fp32 slice; x is packed
// once per call in 16-token tiles, 4 bytes of each token per int32 lane.
// The same function as a8b_tile's (round(x) W^T) up to fp32 rounding (its sums in another order). Per 16 values of
// one row and 16 tokens: 4 vpdpbusd and 2-3 fp32 operations for 256 multiply-adds, against 16 FMAs in block_gemm.h:
// llama.cpp's arithmetic at several times the fp32 GEMM's rate (benchmarks/RESULTS.md).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "block_gemm.h"
#include "blocks.h"
#include "gemv_a8.h"
#include "gemv_a8_blocks.h"
#include "simd.h"

namespace scratchlm {

// x rounded per block (ActRows) packed for a8_gemm_rows: per 16-token tile, q as [k / 4][16 tokens][4 bytes]
// (64-byte lines), d per block and xs per 16 values as [block or group][16 tokens]; tokens past B are zeros.
struct PackedA8 {
  std::vector<int8_t> qbuf;
  std::vector<float> d, xs;
  int8_t* q = nullptr;
  int64_t B = 0, K = 0, qk = 0, tiles = 0;

  PackedA8() = default;
  PackedA8(const PackedA8&) = delete;
  PackedA8& operator=(const PackedA8&) = delete;

  void pack(const ActRows& a) {
    B = a.B, K = a.K, qk = a.qk, tiles = (B + 15) / 16;
    const int64_t nblk = K / qk, ng = K / 16;
    qbuf.assign(tiles * K * 16 + 64, 0);
    q = qbuf.data() + (64 - reinterpret_cast<uintptr_t>(qbuf.data()) % 64) % 64;
    d.assign(tiles * nblk * 16, 0.0f), xs.assign(tiles * ng * 16, 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t tile = b / 16, lane = b % 16;
      const int8_t* src = a.q.data() + b * K;
      int8_t* dst = q + tile * K * 16 + lane * 4;
      for (int64_t k4 = 0; k4 < K / 4; ++k4) std::memcpy(dst + k4 * 64, src + 4 * k4, 4);
      for (int64_t i = 0; i < nblk; ++i) d[(tile * nblk + i) * 16 + lane] = a.d[b * nblk + i];
      for (int64_t g = 0; g < ng; ++g) xs[(tile * ng + g) * 16 + lane] = a.xs[b * ng + g];
    }
  }
};

constexpr int64_t A8G_KC = 256;  // columns per unpacked slice (a multiple of every block's QK)
constexpr int64_t A8G_MC = 64;   // rows per unpacked slice: 64 x 256 bytes of q, + scales
constexpr int A8G_R = 8;         // weight rows per micro-kernel (3 accumulators each)

#if defined(SCRATCHLM_VNNI)
// acc[r][0:16] (tokens of one tile) += the rows' products over the slice's columns [0, kc): w (R x A8G_KC bytes of
// q), s / t (R x A8G_KC / 16 group scales and offsets), xq the tile's packed q at the slice's first column,
// d / xs the tile's block scales and group sums from the slice's first block / group.
template <int R, int64_t QK>
inline void a8_gemm_micro(const uint8_t* w, const float* s, const float* t, const int8_t* xq, const float* d,
                          const float* xs, int64_t kc, float* acc) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_loadu_ps(acc + 16 * r);
  constexpr int64_t G = QK / 16;  // groups per block
  for (int64_t i = 0; i < kc / QK; ++i) {
    __m512 sb[R];
    for (int r = 0; r < R; ++r) sb[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t col = i * QK + 16 * g;  // first column of the group in the slice
      __m512i is[R];
      for (int r = 0; r < R; ++r) is[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int kk = 0; kk < 4; ++kk) {
        const __m512i xv = _mm512_load_si512(xq + (col / 4 + kk) * 64);
        for (int r = 0; r < R; ++r) {
          int32_t wv;
          std::memcpy(&wv, w + r * A8G_KC + col + 4 * kk, 4);
          is[r] = _mm512_dpbusd_epi32(is[r], _mm512_set1_epi32(wv), xv);
        }
      }
      const __m512 xsg = _mm512_loadu_ps(xs + (col / 16) * 16);
      for (int r = 0; r < R; ++r) {
        const int64_t gi = r * (A8G_KC / 16) + col / 16;
        sb[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r]), _mm512_set1_ps(s[gi]), sb[r]);
        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(t[gi]), xsg, a[r]);
      }
    }
    const __m512 dv = _mm512_loadu_ps(d + i * 16);
    for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(sb[r], dv, a[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + 16 * r, a[r]);
}

template <int64_t QK>
inline void a8_gemm_micro_rows(int rows, const uint8_t* w, const float* s, const float* t, const int8_t* xq,
                               const float* d, const float* xs, int64_t kc, float* acc) {
  switch (rows) {
    case 8: return a8_gemm_micro<8, QK>(w, s, t, xq, d, xs, kc, acc);
    case 7: return a8_gemm_micro<7, QK>(w, s, t, xq, d, xs, kc, acc);
    case 6: return a8_gemm_micro<6, QK>(w, s, t, xq, d, xs, kc, acc);
    case 5: return a8_gemm_micro<5, QK>(w, s, t, xq, d, xs, kc, acc);
    case 4: return a8_gemm_micro<4, QK>(w, s, t, xq, d, xs, kc, acc);
    case 3: return a8_gemm_micro<3, QK>(w, s, t, xq, d, xs, kc, acc);
    case 2: return a8_gemm_micro<2, QK>(w, s, t, xq, d, xs, kc, acc);
    default: return a8_gemm_micro<1, QK>(w, s, t, xq, d, xs, kc, acc);
  }
}

// `rows` rows of W (row_bytes apart) from w, columns [k0, k0 + kc): the quants as unsigned bytes (q, or q + 128
// for a signed type) into q (rows x A8G_KC), each 16-value group's scale s_g and offset (t_g, minus 128 s_g for a
// signed type) into s, t (rows x A8G_KC / 16).
template <typename Block>
inline void a8_unpack_slice(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k0, int64_t kc, uint8_t* q,
                            float* s, float* t) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < kc / Block::QK; ++i) {
      const uint8_t* blk = w + r * row_bytes + (k0 / Block::QK + i) * Block::BYTES;
      alignas(64) float sc[32];
      Block::prepare(blk, sc);
      const int64_t g0 = i * Block::QK / 16;
      for (int64_t g = 0; g < Block::QK / 16; ++g) {
        s[r * (A8G_KC / 16) + g0 + g] = sc[g];
        t[r * (A8G_KC / 16) + g0 + g] = Block::SIGNED ? sc[16 + g] - 128.0f * sc[g] : sc[16 + g];
      }
      for (int c = 0; c < static_cast<int>(Block::QK / 32); ++c) {
        B16 lo, hi;
        Block::quants(blk, c, lo, hi);
        uint8_t* dst = q + r * A8G_KC + i * Block::QK + 32 * c;
        store_b16(dst, lo), store_b16(dst + 16, hi);
        if constexpr (Block::SIGNED)
          for (int j = 0; j < 32; ++j) dst[j] ^= 0x80;
      }
    }
}

// y[b * ldy + n] = round(x)[b] . W[n] for n in [n0, n1), every b < xp.B, then fin(b, lo, hi) on each row block's
// values as they land (block_gemm.h's store_block).
template <typename Block, typename Fin>
void a8_gemm_rows(const PackedA8& xp, const uint8_t* w, float* y, int64_t ldy, int64_t n0, int64_t n1,
                  const Fin& fin) {
  const int64_t K = xp.K, tiles = xp.tiles, rows = n1 - n0, nblk = K / Block::QK, ng = K / 16;
  const int64_t row_bytes = nblk * Block::BYTES;
  alignas(64) thread_local uint8_t wq[A8G_MC * A8G_KC];
  alignas(64) thread_local float ws[A8G_MC * A8G_KC / 16], wt[A8G_MC * A8G_KC / 16];
  thread_local FloatBuf acc;  // one row block's (row group, tile, A8G_R, 16)
  for (int64_t m0 = 0; m0 < rows; m0 += A8G_MC) {
    const int64_t mc = std::min(A8G_MC, rows - m0);
    float* sums = zeroed_sums<A8G_R>(acc, A8G_MC, mc, tiles);
    for (int64_t k0 = 0; k0 < K; k0 += A8G_KC) {
      const int64_t kc = std::min(A8G_KC, K - k0);
      a8_unpack_slice<Block>(w + (n0 + m0) * row_bytes, row_bytes, mc, k0, kc, wq, ws, wt);
      for (int64_t j = 0; j < tiles; ++j) {
        const int8_t* xq = xp.q + (j * K + k0) * 16;
        const float* d = xp.d.data() + (j * nblk + k0 / Block::QK) * 16;
        const float* xs = xp.xs.data() + (j * ng + k0 / 16) * 16;
        for (int64_t g = 0; g < mc; g += A8G_R) {
          float* c = sums + ((g / A8G_R) * tiles + j) * A8G_R * 16;
          const int r = static_cast<int>(std::min<int64_t>(A8G_R, mc - g));
          a8_gemm_micro_rows<Block::QK>(r, wq + g * A8G_KC, ws + g * (A8G_KC / 16), wt + g * (A8G_KC / 16), xq, d, xs,
                                        kc, c);
        }
      }
    }
    store_block<A8G_R>(sums, mc, tiles, xp.B, y, ldy, n0 + m0, fin);
  }
}
#endif

// Whether B rows of an A8 row format go through a8_gemm_rows (built with VNNI, past one pass of a8b_rows).
inline bool has_a8_gemm() {
#if defined(SCRATCHLM_VNNI)
  return true;
#else
  return false;
#endif
}

}  // namespace scratchlm
