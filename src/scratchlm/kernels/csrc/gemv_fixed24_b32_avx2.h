// One batch row (decoding) of y = x @ W^T on the 32-value block types Q4_0 / Q4_1 / Q5_0 / Q5_1 with AVX2 (no
// VNNI): gemv_fixed24_b32.h's method (x as 24-bit fixed point per 32 values, X = rne(x 2^k), three int8 digits
// X = 65536 a2 + 256 a1 + a0; every product and sum exact in integers, fp32 only after) in AVX2 instructions, one
// block of one row per register.
//
// A block holds w = d (q - c) (Q4_0: c = 8, Q5_0: c = 16) or w = d q + m (Q4_1, Q5_1), q unsigned (0..15 / 31), so
//   x~ . W[n] = sum over blocks b ( d_b 2^-k_b * sum_i (q_i - c) X_i  +  m_b 2^-k_b * sum_i X_i ).
// Per block, the 32 quants in value order as unsigned bytes q and x's digit planes (Fixed24X32's AVX2 layout):
//   p_j = vpmaddubsw(q, a_j)                         16 x int16, |p_j| <= 2 * 31 * 128: no saturation
//   V   = ((vpmaddwd(p_2, 256) + vpmaddwd(p_1, 1)) << 8) + vpmaddwd(p_0, 1) - c sum X    8 x int32, 4 values each:
//         sum (q - c) X exactly, |V| <= 4 * 31 * 2^23 + 16 * 4 * 2^23 < 2^31 at every step (c sum X prepared)
// then one conversion to fp32 and one FMA by d_b 2^-k_b (exact: d is fp16, 2^-k a power of two); the m terms use
// 2^-k sum X (one rounding). So y = F.linear(x~, dequantized W) up to fp32 rounding, as gemv_fixed24_b32.h
// (tests/kernels/test_fixed24.py). The A8 row formats' one-plane form (Fixed24X32::prepare_q8: x rounded to Q8_0 /
// Q8_K, q in a2's place, d for 2^-k): V = vpmaddwd(vpmaddubsw(q, q8), 1) - c sum q8.
//
// IQ4_NL / IQ4_XS stay on the fp32 kernels here: their values (-127..113) as unsigned bytes reach 241, and two
// products with a digit (2 * 241 * 128) saturate vpmaddubsw's int16.
//
// Why: gemv_centered.h widens each value to fp32 (byte shuffles, conversions, FMAs); on Zen 3 one core reads Q5_0 at
// ~5 GB/s (7 G weights/s) and Q4_0 at ~7 GB/s that way, under what two cores can stream. Here ~14-18 vector ops
// per 32 weights, 6 of them multiplies (benchmarks/RESULTS.md).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "blocks.h"
#include "gemv_fixed24.h"
#include "gemv_fixed24_avx2.h"
#include "gemv_fixed24_b32.h"
#include "simd.h"

namespace scratchlm {

#if defined(SCRATCHLM_FIXED24_AVX2)
// Per type: quants(p) = the block's 32 quants in value order as unsigned bytes; C the offset (w = d (q - C)), M:
// w = d q + m (m the fp16 at byte 2)
template <typename Block>
struct Fixed24B32Avx2;

// 16 bytes of nibbles at p: value i < 16 the low nibble of byte i, 16 + i its high nibble
inline __m256i f24b_nibbles(const uint8_t* p) {
  const __m256i z = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi32(z, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), f24a_bytes(0x0f));
}
// bit i of the 32 bits at p as 0x10 in byte i
inline __m256i f24b_fifth_bits(const uint8_t* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(  // byte i of the result: byte i / 8 of the bits
      _mm256_set1_epi32(bits), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));  // bit i % 8 of each byte
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), f24a_bytes(0x10));
}

template <>
struct Fixed24B32Avx2<Q4_0Block> {  // [d f16][qs 16]
  static constexpr int C = 8;
  static constexpr bool M = false;
  static __m256i quants(const uint8_t* p) { return f24b_nibbles(p + 2); }
};
template <>
struct Fixed24B32Avx2<Q4_1Block> {  // [d f16][m f16][qs 16]
  static constexpr int C = 0;
  static constexpr bool M = true;
  static __m256i quants(const uint8_t* p) { return f24b_nibbles(p + 4); }
};
template <>
struct Fixed24B32Avx2<Q5_0Block> {  // [d f16][qh 4][qs 16]
  static constexpr int C = 16;
  static constexpr bool M = false;
  static __m256i quants(const uint8_t* p) { return _mm256_or_si256(f24b_nibbles(p + 6), f24b_fifth_bits(p + 2)); }
};
template <>
struct Fixed24B32Avx2<Q5_1Block> {  // [d f16][m f16][qh 4][qs 16]
  static constexpr int C = 0;
  static constexpr bool M = true;
  static __m256i quants(const uint8_t* p) { return _mm256_or_si256(f24b_nibbles(p + 8), f24b_fifth_bits(p + 4)); }
};

// The fp16 at byte `at` of n <= 8 consecutive blocks (Block::BYTES apart) from p as fp32 lanes, 0 past n
template <typename Block>
inline __m256 f24b_halves(const uint8_t* p, int at, int n) {
  __m128i h = _mm_setzero_si128();
  const auto word = [&](int j) { return *reinterpret_cast<const uint16_t*>(p + j * Block::BYTES + at); };
  if (n == 8) {
    h = _mm_setr_epi16(word(0), word(1), word(2), word(3), word(4), word(5), word(6), word(7));
  } else {
    alignas(16) uint16_t v[8] = {};
    for (int j = 0; j < n; ++j) v[j] = word(j);
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(v));
  }
  return _mm256_cvtph_ps(h);
}

// y[n .. n + 4) (rows past n_end - 1 repeat the last row and are not written) for one batch row, 8 blocks per step:
// per row the 8 blocks' d (and m) as one fp32 register times x's 2^-k (2^-k sum X), then per block V converted and
// one FMA by its lane of d 2^-k; one 8-lane fp32 sum per row (and the M types' m 2^-k sum X lanes).
template <typename Block, int PLANES>
inline void fixed24_b32_avx2_tile(const Fixed24X32& xf, const uint8_t* w, float* y, int64_t n, int64_t n_end,
                                  int64_t row_bytes) {
  using F = Fixed24B32Avx2<Block>;
  constexpr int NR = 4;
  const uint8_t* row[NR];
  tile_rows<NR>(w, n, n_end, row_bytes, row);
  __m256 tot[NR][2];  // even / odd blocks: two FMA chains per row
  for (int r = 0; r < NR; ++r) tot[r][0] = tot[r][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t nb = xf.K / 32;
  for (int64_t g = 0; g < nb; g += 8) {
    const int cnt = static_cast<int>(std::min<int64_t>(8, nb - g));
    const __m256 xs = _mm256_loadu_ps(xf.xs.data() + g);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk0 = row[r] + g * Block::BYTES;
      for (int64_t o = 0; o < 8 * Block::BYTES; o += 64) prefetch(blk0 + 2 * NR * row_bytes + o);  // the tile after next
      const __m256 ds = _mm256_mul_ps(f24b_halves<Block>(blk0, 0, cnt), xs);  // lane j: d 2^-k of block g + j
      if constexpr (F::M)
        tot[r][1] = _mm256_fmadd_ps(f24b_halves<Block>(blk0, 2, cnt), _mm256_loadu_ps(xf.xo.data() + g), tot[r][1]);
      const auto one = [&](int j) {
        const uint8_t* blk = blk0 + j * Block::BYTES;
        const int8_t* st = xf.block(g + j);
        const __m256i q = F::quants(blk);
        const __m256i p2 = _mm256_maddubs_epi16(q, _mm256_load_si256(reinterpret_cast<const __m256i*>(st)));
        __m256i v;
        if constexpr (PLANES == 1) {
          v = _mm256_madd_epi16(p2, ones);
        } else {
          const __m256i p1 = _mm256_maddubs_epi16(q, _mm256_load_si256(reinterpret_cast<const __m256i*>(st + 32)));
          const __m256i p0 = _mm256_maddubs_epi16(q, _mm256_load_si256(reinterpret_cast<const __m256i*>(st + 64)));
          const __m256i m =
              _mm256_add_epi32(_mm256_madd_epi16(p2, _mm256_set1_epi16(256)), _mm256_madd_epi16(p1, ones));
          v = _mm256_add_epi32(_mm256_slli_epi32(m, 8), _mm256_madd_epi16(p0, ones));
        }
        if constexpr (F::C != 0)
          v = _mm256_sub_epi32(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                      st + (F::C == 8 ? Fixed24X32::A_C8 : Fixed24X32::A_C16))));
        tot[r][j & 1] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(j)), tot[r][j & 1]);
      };
      if (cnt == 8) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) one(j);
      } else {
        for (int j = 0; j < cnt; ++j) one(j);
      }
    }
  }
  for (int r = 0; r < NR && n + r < n_end; ++r) y[n + r] = hsum8(_mm256_add_ps(tot[r][0], tot[r][1]));
}

template <typename Block>  // (callers check has_fixed24_b32<Block>())
void fixed24_b32_rows(const Fixed24X32& xf, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  fixed24_tiles<Block>(xf, n0, n1, [&](auto p, int64_t n, int64_t rb) { fixed24_b32_avx2_tile<Block, p()>(xf, w, y, n, n1, rb); });
}
#endif

}  // namespace scratchlm
