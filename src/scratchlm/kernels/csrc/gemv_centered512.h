// One batch row (decoding) of y = x @ W^T on the K-quants Q5_K / Q6_K, AVX-512: sub-block sums of the centered
// integers (gemv_centered.h's function) with every scale in a register.
//
// As on AVX2, a sub-block j (32 values; Q6_K: 16) holds w = s_j q + t_j with small integers q, so
//   x . W[n] = sum_j ( s_j * sum_{i in j} (q_i - z) x_i  +  o_j * X_j ),   o_j = t_j + z s_j,   X_j = sum_{i in j} x_i
// (z = 8 / 16 / 32 for 4 / 5 / 6 bits; Q6_K has t = -z s, no offsets). Same function as F.linear(x, dequantized W)
// up to fp32 rounding; the sums of |(q - z) x| are about half those of |w x| gemv.h rounds.
//
// Why on AVX-512 (Zen 5, benchmarks/RESULTS.md): gemv.h's widening unpacks Q6_K's 6-bit values 16 bytes at a time
// and broadcasts two scales from the stack per 32 values; here 64 bytes of quants are unpacked at once, each 16
// values take one byte permute (vpermb: the centered byte to the top of a 32-bit lane), one conversion and one
// multiply with x, and each sub-block one FMA by its scale, taken from the block's scale register by a lane
// permute. Q6_K: 1.23-1.25x gemv.h's weights per second on one core, 1.07-1.10x streaming from DRAM on two; Q5_K
// 1.05x. Q4_K the same way ran at 0.92-0.97x of gemv.h's widening (its nibbles need no unpacking), so it keeps
// gemv.h.
//
// Bit layout: 64 bytes of a block's quants at once (128 values, four 32-value chunks) become two registers of
// centered bytes (q - z) << (8 - bits) as int8; the byte at the top of an int32 lane reads (q - z) 2^(32 - bits),
// exact in fp32, and the 2^-(32 - bits) goes into the scales (a power of two: exact). x is read in index order.

#pragma once

#include <cstdint>
#include <type_traits>

#include "blocks.h"
#include "simd.h"

namespace scratchlm {

#if defined(SCRATCHLM_AVX512)
// vpermb controls: quarter k (bytes 16k .. 16k + 15) of a register to the top byte of the 16 int32 lanes
#define SCRATCHLM_TOP(k, j) -1, -1, -1, 16 * k + j
#define SCRATCHLM_QUARTER(k)                                                                                \
  {SCRATCHLM_TOP(k, 0),  SCRATCHLM_TOP(k, 1),  SCRATCHLM_TOP(k, 2),  SCRATCHLM_TOP(k, 3),  SCRATCHLM_TOP(k, 4),  \
   SCRATCHLM_TOP(k, 5),  SCRATCHLM_TOP(k, 6),  SCRATCHLM_TOP(k, 7),  SCRATCHLM_TOP(k, 8),  SCRATCHLM_TOP(k, 9),  \
   SCRATCHLM_TOP(k, 10), SCRATCHLM_TOP(k, 11), SCRATCHLM_TOP(k, 12), SCRATCHLM_TOP(k, 13), SCRATCHLM_TOP(k, 14), \
   SCRATCHLM_TOP(k, 15)}
alignas(64) inline constexpr int8_t TOP_QUARTER[4][64] = {SCRATCHLM_QUARTER(0), SCRATCHLM_QUARTER(1),
                                                          SCRATCHLM_QUARTER(2), SCRATCHLM_QUARTER(3)};
#undef SCRATCHLM_QUARTER
#undef SCRATCHLM_TOP

// bytes 16k .. 16k + 15 of q (int8) as fp32 lanes, each times 2^24 (exact)
inline __m512 top_quarter(__m512i q, int k) {
#if defined(__AVX512VBMI__)
  const __m512i ctl = _mm512_load_si512(TOP_QUARTER[k]);
  return _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(0x8888888888888888ull, ctl, q));
#else
  const __m128i b = k == 0 ? _mm512_castsi512_si128(q) : k == 1 ? _mm512_extracti32x4_epi32(q, 1)
                    : k == 2 ? _mm512_extracti32x4_epi32(q, 2) : _mm512_extracti32x4_epi32(q, 3);
  return _mm512_cvtepi32_ps(_mm512_slli_epi32(_mm512_cvtepi8_epi32(b), 24));
#endif
}

inline __m512i bytes_set1(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }

// f(a, b, c) per bit for vpternlog: (a & b) ^ c and (a & c) | b
constexpr int AND_XOR = 0x6a, AND_OR = 0xec;

// Per type: SUB values per scale (32, or 16: HALVES), OFFSETS; scales(p): a register of the block's scales s_j
// (times 2^-(32 - bits)) in lanes 0 .. 256 / SUB - 1, and for OFFSETS the offsets o_j in lanes 8-15; quad(p, j, q)
// the 128 values of chunks 4j .. 4j + 3 as two registers of centered bytes, chunk CHUNK[h] in half h % 2 of
// q[h / 2] (bytes 32 (h % 2) .. + 31).
template <typename Block>
struct Centered512;

// Q4_K / Q5_K: k4_scales8's d sc_j and -(dmin m_j) in a register; s_j 2^-SHIFT, o_j = -(dmin m_j) + Z d sc_j
template <int SHIFT, int Z>
inline __m512 k4_centered512(const uint8_t* p) {
  uint32_t u[4];
  k4_unpack(p, u);  // as k4_scales8, kept in registers
  const __m128i b = _mm_setr_epi32(static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(u[2]),
                                   static_cast<int>(u[3]));
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)),
                                 vset2(fp16_to_f32(p), -fp16_to_f32(p + 2)).v);  // d sc_j | -(dmin m_j)
  const __m512 sc = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7), v);
  const __m512 o = _mm512_fmadd_ps(sc, _mm512_set1_ps(static_cast<float>(Z)), v);  // lanes 8-15: t_j + Z s_j
  return _mm512_mask_blend_ps(0xff00, _mm512_mul_ps(v, _mm512_set1_ps(1.0f / static_cast<float>(1ll << SHIFT))), o);
}

template <>
struct Centered512<Q5_KBlock> {  // [d][dmin][scales 12][qh 32][qs 128]: as Q4_K, q | bit c of qh[l] << 4
  static constexpr int SUB = 32;
  static constexpr bool OFFSETS = true;
  static constexpr int CHUNK[4] = {0, 2, 1, 3};
  static __m512 scales(const uint8_t* p) { return k4_centered512<27, 16>(p); }
  static void quad(const uint8_t* p, int j, __m512i* q) {
    const __m512i z = _mm512_loadu_si512(p + 48 + 64 * j);
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
    // bit c of qh[l] to bit 7 of byte l, inverted (the final ^ 0x80), for chunks 4j | 4j + 2 and 4j + 1 | 4j + 3
    const int c = 4 * j;
    const __m512i lo_bit = _mm512_andnot_si512(
        _mm512_sllv_epi64(h, _mm512_setr_epi64(7 - c, 7 - c, 7 - c, 7 - c, 5 - c, 5 - c, 5 - c, 5 - c)), bytes_set1(0x80));
    const __m512i hi_bit = _mm512_andnot_si512(
        _mm512_sllv_epi64(h, _mm512_setr_epi64(6 - c, 6 - c, 6 - c, 6 - c, 4 - c, 4 - c, 4 - c, 4 - c)), bytes_set1(0x80));
    const __m512i nib = bytes_set1(0x78);  // the nibble at bits 3-6: (q - 16) << 3 with bit 7
    q[0] = _mm512_ternarylogic_epi32(_mm512_slli_epi16(z, 3), lo_bit, nib, AND_OR);
    q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 1), hi_bit, nib, AND_OR);
  }
};

template <>
struct Centered512<Q6_KBlock> {  // [ql 128][qh 64][scales 16 x int8][d]: chunk 4h + g as blocks.h's Q6_KBlock
  static constexpr int SUB = 16;
  static constexpr bool OFFSETS = false;
  static constexpr int CHUNK[4] = {0, 1, 2, 3};
  static __m512 scales(const uint8_t* p) {  // d sc_j 2^-26
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192))));
    return _mm512_mul_ps(_mm512_mul_ps(sc, _mm512_set1_ps(fp16_to_f32(p + 208))), _mm512_set1_ps(0x1p-26f));
  }
  static void quad(const uint8_t* p, int j, __m512i* q) {  // (q - 32) << 2: the nibble to bits 2-5, qh's two to 6-7
    const __m512i z = _mm512_loadu_si512(p + 64 * j);  // ql of chunks 4j | 4j + 1 (low nibbles), 4j + 2 | 4j + 3
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * j)));
    const __m512i two = bytes_set1(0xc0), flip = bytes_set1(0x80), nib = bytes_set1(0x3c);
    const __m512i h01 = _mm512_ternarylogic_epi32(_mm512_sllv_epi64(h, _mm512_setr_epi64(6, 6, 6, 6, 4, 4, 4, 4)),
                                                  two, flip, AND_XOR);
    const __m512i h23 = _mm512_ternarylogic_epi32(_mm512_sllv_epi64(h, _mm512_setr_epi64(2, 2, 2, 2, 0, 0, 0, 0)),
                                                  two, flip, AND_XOR);
    q[0] = _mm512_ternarylogic_epi32(_mm512_slli_epi16(z, 2), h01, nib, AND_OR);
    q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 2), h23, nib, AND_OR);
  }
};

template <typename Block>
constexpr bool has_centered512() {
  return std::is_same_v<Block, Q5_KBlock> || std::is_same_v<Block, Q6_KBlock>;
}

// lane j of v in every lane
inline __m512 lane(__m512 v, int j) { return _mm512_permutexvar_ps(_mm512_set1_epi32(j), v); }

// y[n .. n + NR) for one batch row x (K values, index order); xs[c]: sum of x's 32-value chunk c. Per row two
// accumulators (chunks alternate; Q6_K: a chunk's two halves) and, for offsets, one more; summed at the end.
template <typename Block, int NR>
inline void centered512_tile(const float* x, const float* xs, int64_t K, const uint8_t* w, float* y, int64_t n,
                             int64_t row_bytes) {
  using C = Centered512<Block>;
  __m512 tot[NR][2], off[NR];
  for (int r = 0; r < NR; ++r) tot[r][0] = tot[r][1] = off[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K / 256; ++i) {
    __m512 v[NR];
    __m512 xsv = _mm512_setzero_ps();  // lanes 8-15: the block's 8 chunk sums, against the offsets' lanes
    if constexpr (C::OFFSETS)
      xsv = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(_mm256_loadu_ps(xs + 8 * i)), 1));
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + (n + r) * row_bytes + i * Block::BYTES;
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk + 2 * NR * row_bytes + o);  // the tile after next
      v[r] = C::scales(blk);
      if constexpr (C::OFFSETS) off[r] = _mm512_fmadd_ps(v[r], xsv, off[r]);
    }
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      const float* xq = x + 256 * i + 128 * j;
      for (int r = 0; r < NR; ++r) {
        __m512i q[2];
        C::quad(w + (n + r) * row_bytes + i * Block::BYTES, j, q);
#pragma GCC unroll 4
        for (int h = 0; h < 4; ++h) {
          const int c = C::CHUNK[h];  // chunk 4j + c of the block
          const __m512 e0 = top_quarter(q[h >> 1], 2 * (h & 1)), e1 = top_quarter(q[h >> 1], 2 * (h & 1) + 1);
          const __m512 x0 = _mm512_loadu_ps(xq + 32 * c), x1 = _mm512_loadu_ps(xq + 32 * c + 16);
          if constexpr (C::SUB == 16) {
            const int s = 2 * (4 * j + c);
            tot[r][0] = _mm512_fmadd_ps(_mm512_mul_ps(e0, x0), lane(v[r], s), tot[r][0]);
            tot[r][1] = _mm512_fmadd_ps(_mm512_mul_ps(e1, x1), lane(v[r], s + 1), tot[r][1]);
          } else {
            const __m512 p = _mm512_fmadd_ps(e1, x1, _mm512_mul_ps(e0, x0));
            tot[r][h & 1] = _mm512_fmadd_ps(p, lane(v[r], 4 * j + c), tot[r][h & 1]);
          }
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    y[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(tot[r][0], tot[r][1]), off[r]));
}

template <typename Block>
void centered512_rows(const float* x, const float* xs, int64_t K, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  constexpr int NR = 4;
  const int64_t row_bytes = (K / Block::QK) * Block::BYTES;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) centered512_tile<Block, NR>(x, xs, K, w, y, n, row_bytes);
  for (; n < n1; ++n) centered512_tile<Block, 1>(x, xs, K, w, y, n, row_bytes);
}
#endif

}  // namespace scratchlm
