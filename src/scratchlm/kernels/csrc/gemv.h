// scratchlm decode kernels: y (B, N) = x (B, K) @ W^T for small B (decoding), W stored compactly.
//
// Every kernel widens W exactly to fp32 in registers and accumulates x * w with fp32 FMAs, so it computes
// the same function as F.linear(x, dequantized W) (up to fp32 summation order):
//   dense   f32 w = W[n, k];  bf16 w = bits << 16;  f16 w = the half widened (all exact)
//   blocks  every ggml type of blocks.h (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K .. Q6_K, IQ4_XS):
//           the values quant/dequantize.py computes, bit for bit
// A block type reads K in its blocks (32 values, or 256 for the K-quants); dense rows K in 16s.
// matrix_ref.h splits rows over threads; gemv_a8.h holds the integer (8-bit activation) kernels; one batch row of
// Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K goes through gemv_centered.h on AVX2 (sub-block sums, no widening), of
// Q5_K / Q6_K through gemv_centered512.h on AVX-512.
// simd.h picks the inner loops' instructions (AVX-512, AVX2, or a portable loop) at compile time.

#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "blocks.h"
#include "simd.h"

namespace scratchlm {

constexpr int64_t BATCH_TILE = 4;  // batch rows sharing one widened weight vector

// Weight rows per tile for NB batch rows: NR * NB * 2 independent FMA chains hide the FMA latency (one row
// alone is a 4-cycle-per-chunk dependency chain); AVX-512 has the registers for 4 rows of one batch row.
template <int NB>
constexpr int tile_rows() {
#ifdef SCRATCHLM_AVX512
  return NB == 1 ? 4 : (NB == 2 ? 2 : 1);
#else
  return NB == 1 ? 2 : 1;
#endif
}

// NR weight rows n .. n + NR - 1 x NB batch rows b0 .. b0 + NB - 1, every accumulator a register.
// y[b, n] lands at y[b * ldy + n].
template <typename Block, int NB, int NR>
inline void block_tile(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0, int64_t n,
                       int64_t row_bytes) {
  VF acc[NR][NB][2];
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b][0] = acc[r][b][1] = vzero();
  const int64_t nblk = K / Block::QK;
  for (int64_t i = 0; i < nblk; ++i) {
    alignas(64) float sc[NR][32];  // each row's block scales (chunk_scales)
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + (n + r) * row_bytes + i * Block::BYTES;
      // the same block of the tile after next: keeps DRAM reads in flight while the FMAs run
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk + 2 * NR * row_bytes + o);
      chunk_scales<Block>(blk, sc[r]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < static_cast<int>(Block::QK / 32); ++c) {
      const int64_t k = i * Block::QK + 32 * c;
      VF xv[NB][2];
      for (int b = 0; b < NB; ++b) xv[b][0] = vload(x + (b0 + b) * K + k), xv[b][1] = vload(x + (b0 + b) * K + k + 16);
      for (int r = 0; r < NR; ++r) {
        VF lo, hi;
        Block::chunk(w + (n + r) * row_bytes + i * Block::BYTES, sc[r], c, lo, hi);
        for (int b = 0; b < NB; ++b) {
          acc[r][b][0] = vfma(lo, xv[b][0], acc[r][b][0]);
          acc[r][b][1] = vfma(hi, xv[b][1], acc[r][b][1]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) y[(b0 + b) * ldy + n + r] = vsum(vadd(acc[r][b][0], acc[r][b][1]));
}

#if defined(SCRATCHLM_AVX2)
// AVX2, 3..8 batch rows (and one row of a 32-value block type): one 8-lane accumulator per (weight row, batch row)
// (NR * NB + 4 of the 16 registers), each 32-value chunk widened once for all NB rows. block_tile's two 16-lane accumulators per row run out of registers past 2
// rows, so 4-row passes ran no faster than 2-row ones; this tile at 8 rows does 1.3-1.45x their weight-rows/s
// (Q4_1, Q4_K, Q6_K, Q8_0 on Zen 3, benchmarks/RESULTS.md). Each (n, b) sums its chunks' four 8-value parts
// into one chain: fp32 summation order differs from block_tile's, the values do not.
constexpr int64_t BLOCK_BATCH_TILE = 8;

template <typename Block, int NB, int NR>
inline void block_tile_wide(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0, int64_t n,
                            int64_t row_bytes) {
  __m256 acc[NR][NB];
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_setzero_ps();
  const int64_t nblk = K / Block::QK;
  const float* xb = x + b0 * K;
  for (int64_t i = 0; i < nblk; ++i) {
    alignas(64) float sc[NR][32];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + (n + r) * row_bytes + i * Block::BYTES;
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk + 2 * NR * row_bytes + o);  // the tile after next
      chunk_scales<Block>(blk, sc[r]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < static_cast<int>(Block::QK / 32); ++c) {
      const int64_t k = i * Block::QK + 32 * c;
      for (int r = 0; r < NR; ++r) {
        VF lo, hi;
        Block::chunk(w + (n + r) * row_bytes + i * Block::BYTES, sc[r], c, lo, hi);
        for (int b = 0; b < NB; ++b) {
          const float* xr = xb + b * K + k;
          acc[r][b] = _mm256_fmadd_ps(lo.lo, _mm256_loadu_ps(xr), acc[r][b]);
          acc[r][b] = _mm256_fmadd_ps(lo.hi, _mm256_loadu_ps(xr + 8), acc[r][b]);
          acc[r][b] = _mm256_fmadd_ps(hi.lo, _mm256_loadu_ps(xr + 16), acc[r][b]);
          acc[r][b] = _mm256_fmadd_ps(hi.hi, _mm256_loadu_ps(xr + 24), acc[r][b]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) y[(b0 + b) * ldy + n + r] = hsum8(acc[r][b]);
}

// NB batch rows; NR weight rows per tile (4 for one batch row: four chains hide the FMA latency)
template <typename Block, int NB>
inline void block_rows_wide(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0,
                            int64_t n0, int64_t n1) {
  constexpr int NR = NB == 1 ? 4 : 1;
  const int64_t row_bytes = (K / Block::QK) * Block::BYTES;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) block_tile_wide<Block, NB, NR>(x, w, y, K, ldy, b0, n, row_bytes);
  for (; n < n1; ++n) block_tile_wide<Block, NB, 1>(x, w, y, K, ldy, b0, n, row_bytes);
}
#else
constexpr int64_t BLOCK_BATCH_TILE = BATCH_TILE;
#endif

template <typename Block, int NB>
inline void block_rows_nb(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0, int64_t n0,
                          int64_t n1) {
  constexpr int NR = tile_rows<NB>();
  const int64_t row_bytes = (K / Block::QK) * Block::BYTES;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) block_tile<Block, NB, NR>(x, w, y, K, ldy, b0, n, row_bytes);
  for (; n < n1; ++n) block_tile<Block, NB, 1>(x, w, y, K, ldy, b0, n, row_bytes);
}

// y[b, n] = sum_k x[b, k] * w[n, k] for rows n in [n0, n1), batch rows [b0, b0 + nb), nb <= BLOCK_BATCH_TILE.
template <typename Block>
void block_rows(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0, int64_t nb,
                int64_t n0, int64_t n1) {
  switch (nb) {
#if defined(SCRATCHLM_AVX2)
    case 1:  // 4 weight rows x one 8-lane accumulator: ~1.2x block_tile on the 32-value blocks and Q4_K, 1.1x Q5_K /
             // Q3_K; Q6_K, Q2_K, IQ4_XS keep block_tile (0.9-1.0x wide at DRAM-sized matrices), RESULTS.md
      if constexpr (Block::QK == 32 || std::is_same_v<Block, Q4_KBlock> || std::is_same_v<Block, Q5_KBlock> ||
                    std::is_same_v<Block, Q3_KBlock>)
        return block_rows_wide<Block, 1>(x, w, y, K, ldy, b0, n0, n1);
      return block_rows_nb<Block, 1>(x, w, y, K, ldy, b0, n0, n1);
#else
    case 1: return block_rows_nb<Block, 1>(x, w, y, K, ldy, b0, n0, n1);
#endif
    case 2: return block_rows_nb<Block, 2>(x, w, y, K, ldy, b0, n0, n1);
#if defined(SCRATCHLM_AVX2)
    case 3: return block_rows_wide<Block, 3>(x, w, y, K, ldy, b0, n0, n1);
    case 4: return block_rows_wide<Block, 4>(x, w, y, K, ldy, b0, n0, n1);
    case 5: return block_rows_wide<Block, 5>(x, w, y, K, ldy, b0, n0, n1);
    case 6: return block_rows_wide<Block, 6>(x, w, y, K, ldy, b0, n0, n1);
    case 7: return block_rows_wide<Block, 7>(x, w, y, K, ldy, b0, n0, n1);
    default: return block_rows_wide<Block, 8>(x, w, y, K, ldy, b0, n0, n1);
#else
    case 3: return block_rows_nb<Block, 3>(x, w, y, K, ldy, b0, n0, n1);
    default: return block_rows_nb<Block, 4>(x, w, y, K, ldy, b0, n0, n1);
#endif
  }
}

// Dense element types: SIZE bytes per value, load = 16 values widened exactly.
struct F32Dense {
  static constexpr int64_t SIZE = 4;
  static VF load(const uint8_t* p) { return vload(reinterpret_cast<const float*>(p)); }
};
struct BF16Dense {
  static constexpr int64_t SIZE = 2;
  static VF load(const uint8_t* p) { return bf16_f(p); }
};
struct F16Dense {
  static constexpr int64_t SIZE = 2;
  static VF load(const uint8_t* p) { return f16_f(p); }
};

template <typename T, int NB>
inline void dense_rows_nb(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0, int64_t n0,
                          int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * K * T::SIZE;
    VF acc[NB][2];
    for (int b = 0; b < NB; ++b) acc[b][0] = acc[b][1] = vzero();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      prefetch(row + (K + k) * T::SIZE);  // the next row
      const VF w0 = T::load(row + k * T::SIZE), w1 = T::load(row + (k + 16) * T::SIZE);
      for (int b = 0; b < NB; ++b) {
        acc[b][0] = vfma(w0, vload(x + (b0 + b) * K + k), acc[b][0]);
        acc[b][1] = vfma(w1, vload(x + (b0 + b) * K + k + 16), acc[b][1]);
      }
    }
    for (; k < K; k += 16) {
      const VF w0 = T::load(row + k * T::SIZE);
      for (int b = 0; b < NB; ++b) acc[b][0] = vfma(w0, vload(x + (b0 + b) * K + k), acc[b][0]);
    }
    for (int b = 0; b < NB; ++b) y[(b0 + b) * ldy + n] = vsum(vadd(acc[b][0], acc[b][1]));
  }
}

// Dense rows (fp32, bf16 or f16 weights), K a multiple of 16.
template <typename T>
void dense_rows(const float* x, const uint8_t* w, float* y, int64_t K, int64_t ldy, int64_t b0, int64_t nb, int64_t n0,
                int64_t n1) {
  switch (nb) {
    case 1: return dense_rows_nb<T, 1>(x, w, y, K, ldy, b0, n0, n1);
    case 2: return dense_rows_nb<T, 2>(x, w, y, K, ldy, b0, n0, n1);
    case 3: return dense_rows_nb<T, 3>(x, w, y, K, ldy, b0, n0, n1);
    default: return dense_rows_nb<T, 4>(x, w, y, K, ldy, b0, n0, n1);
  }
}

}  // namespace scratchlm
