// One batch row (decoding) of y = x @ W^T on Q5_K / Q6_K with AVX2 (no VNNI): gemv_fixed24.h's arithmetic
// (x as 24-bit fixed point per 32 values, Fixed24X, every product and sum exact in integers, fp32 only after) in
// AVX2 instructions, 32 weights of one row per register.
//
// Per 32-value sub-block of quants q (unsigned bytes: Q5_K 0..31, Q6_K 0..63) and x's digits a2, a1, a0
// (X = 65536 a2 + 256 a1 + a0, Fixed24X's layout):
//   p_j = vpmaddubsw(q, a_j)            16 x int16: q_2m a_j,2m + q_2m+1 a_j,2m+1, |p_j| <= 2 * 63 * 128 (no
//                                       saturation)
//   m   = vpmaddwd(p_2, 256) + vpmaddwd(p_1, 1)      8 x int32, each lane 4 consecutive values: 256 (q.a2) + q.a1
//   dot = (m << 8) + vpmaddwd(p_0, 1)                = sum of those 4 values' q X, |dot| <= 4 * 63 * (2^23 - 2^16)
// exact (< 2^31), then one conversion to fp32 and one FMA by the lane's scale s 2^-k; the offsets t as gemv_fixed24.h
// (t times x~'s sums). So the same terms as gemv_fixed24.h's vpdpbusd form: y = F.linear(x~, dequantized W) up to
// fp32 rounding (tests/kernels/test_fixed24.py runs on either build). The A8 row formats' one-plane form (x rounded to
// Q8_K, Fixed24X::prepare_q8): dot = vpmaddwd(vpmaddubsw(q, q8), 1).
//
// Why: gemv_centered.h, the fp32 form on AVX2, spends ~17 vector ops per 32 weights (4 byte shuffles, 4 int -> fp32
// conversions, 5 FMAs, the unpacking) against ~12 here, 6 of them multiplies. Zen 3, one core, one call after
// another (8192 x 2048 and 2048 x 8192): Q5_K 1.22x gemv_centered.h's weights per second, Q6_K 1.12-1.23x; Q4_K
// 0.92-0.98x (its centered form unpacks a nibble pair in 3 ops and Zen 3 has few multiply ports), so Q4_K stays there
// (benchmarks/RESULTS.md).

#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "blocks.h"
#include "gemv_fixed24.h"
#include "simd.h"

namespace scratchlm {

#if defined(SCRATCHLM_FIXED24_AVX2)
inline __m256i f24a_bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

// the 4-value dot products of 32 quants q with digit planes at d (PLANES 3: a2, a1, a0, 64 bytes apart; 1: q8)
template <int PLANES>
inline __m256i f24a_dot(__m256i q, const int8_t* d) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i p2 = _mm256_maddubs_epi16(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
  if constexpr (PLANES == 1) {
    return _mm256_madd_epi16(p2, ones);
  } else {
    const __m256i p1 = _mm256_maddubs_epi16(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 64)));
    const __m256i p0 = _mm256_maddubs_epi16(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 128)));
    const __m256i m = _mm256_add_epi32(_mm256_madd_epi16(p2, _mm256_set1_epi16(256)), _mm256_madd_epi16(p1, ones));
    return _mm256_add_epi32(_mm256_slli_epi32(m, 8), _mm256_madd_epi16(p0, ones));
  }
}

// Per type: PAIR (x in Fixed24X's pair order: Q5_K) or index order (Q6_K); quants(p, t) = sub-block t's 32
// values as unsigned bytes; scales(p, v, m): v = each scale lane (PAIR: 8 sub-blocks; else 16 groups of 16), m = what
// multiplies x's sums (k4o / g16o lanes) into the offsets.
template <typename Block>
struct Fixed24Avx2;

template <>
struct Fixed24Avx2<Q5_KBlock> {  // sub-block t: nibble t % 2 of qs[32 (t / 2) + l] | bit t of qh[l] << 4
  static constexpr bool PAIR = true;
  static void scales(const uint8_t* p, float* v) { k4_scales8(p, v); }
  static __m256i quants(const uint8_t* p, int t) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 48 + 32 * (t >> 1)));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    // bit t of each byte to bit 4 (a 16-bit shift by |t - 4|: the masked bit stays in its own byte)
    const __m256i hb =
        t >= 4 ? _mm256_srl_epi16(h, _mm_cvtsi32_si128(t - 4)) : _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - t));
    return _mm256_or_si256(_mm256_and_si256(t & 1 ? _mm256_srli_epi16(z, 4) : z, f24a_bytes(0x0f)),
                           _mm256_and_si256(hb, f24a_bytes(0x10)));
  }
};

template <>
struct Fixed24Avx2<Q6_KBlock> {  // value 128j + 32g + l: nibble g / 2 of ql[64j + 32 (g % 2) + l] | bits 2g, 2g + 1
                                 // of qh[32j + l] << 4
  static constexpr bool PAIR = false;
  static void scales(const uint8_t* p, float* v) { Q6_KBlock::prepare(p, v); }  // v[g] = d sc_g, v[16 + g] = -32 v[g]
  static __m256i quants(const uint8_t* p, int t) {
    const int j = t >> 2, g = t & 3;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * j + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * j));
    const __m256i lo = _mm256_and_si256(g >> 1 ? _mm256_srli_epi16(ql, 4) : ql, f24a_bytes(0x0f));
    // bits 2g, 2g + 1 to bits 4, 5 (a 16-bit shift by |2g - 4|, as Q5_K's)
    const __m256i hb = g >= 2 ? _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g - 4))
                              : _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - 2 * g));
    return _mm256_or_si256(lo, _mm256_and_si256(hb, f24a_bytes(0x30)));
  }
};

// y[n .. n + 4) (rows past n_end - 1 repeat the last row and are not written) for one batch row: per row one
// 8-lane fp32 sum (each sub-block's converted dots times its scale, in order) and the offsets' sum.
template <typename Block, int PLANES>
inline void fixed24_avx2_tile(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n, int64_t n_end,
                              int64_t row_bytes) {
  using F = Fixed24Avx2<Block>;
  constexpr int NR = 4;
  const auto [dig, xs, xo] = xf.order(F::PAIR);
  const uint8_t* row[NR];
  tile_rows<NR>(w, n, n_end, row_bytes, row);
  __m256 tot[NR], off[NR];
  for (int r = 0; r < NR; ++r) tot[r] = off[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < xf.K / 256; ++i) {
    alignas(32) float sv[NR][32];  // each lane's scale times 2^-k (PAIR: 8 sub-blocks; else 16 groups)
    const uint8_t* blk[NR];
    for (int r = 0; r < NR; ++r) {
      blk[r] = row[r] + i * Block::BYTES;
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk[r] + 2 * NR * row_bytes + o);  // the tile after next
      F::scales(blk[r], sv[r]);
      if constexpr (F::PAIR) {  // lanes 8-15: -(dmin m_t) against k4o's sums of sub-block t
        off[r] = _mm256_fmadd_ps(_mm256_load_ps(sv[r] + 8), _mm256_loadu_ps(xo + 16 * i + 8), off[r]);
        _mm256_store_ps(sv[r], _mm256_mul_ps(_mm256_load_ps(sv[r]), _mm256_loadu_ps(xs + 16 * i)));
      } else {  // lanes 16-31: -32 d sc_g against g16o's sums of group g
        off[r] = _mm256_fmadd_ps(_mm256_load_ps(sv[r] + 16), _mm256_loadu_ps(xo + 16 * i), off[r]);
        off[r] = _mm256_fmadd_ps(_mm256_load_ps(sv[r] + 24), _mm256_loadu_ps(xo + 16 * i + 8), off[r]);
        _mm256_store_ps(sv[r], _mm256_mul_ps(_mm256_load_ps(sv[r]), _mm256_loadu_ps(xs + 16 * i)));
        _mm256_store_ps(sv[r] + 8, _mm256_mul_ps(_mm256_load_ps(sv[r] + 8), _mm256_loadu_ps(xs + 16 * i + 8)));
      }
    }
    const int8_t* d = dig + i * 256 * PLANES;
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      // sub-block t's digits: PAIR chunk 2 (t / 4) + t % 2, half (t % 4) / 2; index order chunk t / 2, half t % 2
      const int c = F::PAIR ? 2 * (t >> 2) + (t & 1) : t >> 1, h = F::PAIR ? (t & 3) >> 1 : t & 1;
      const int8_t* dt = d + c * 64 * PLANES + 32 * h;
      for (int r = 0; r < NR; ++r) {
        const __m256 lanes = _mm256_cvtepi32_ps(f24a_dot<PLANES>(F::quants(blk[r], t), dt));
        const __m256 s =  // index order: lanes 0-3 / 4-7 are groups 2t / 2t + 1
            F::PAIR ? _mm256_broadcast_ss(sv[r] + t)
                    : _mm256_set_m128(_mm_broadcast_ss(sv[r] + 2 * t + 1), _mm_broadcast_ss(sv[r] + 2 * t));
        tot[r] = _mm256_fmadd_ps(lanes, s, tot[r]);
      }
    }
  }
  for (int r = 0; r < NR && n + r < n_end; ++r) y[n + r] = hsum8(_mm256_add_ps(tot[r], off[r]));
}

template <typename Block>
void fixed24_rows(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  if constexpr (has_fixed24<Block>()) {
    const int64_t row_bytes = (xf.K / Block::QK) * Block::BYTES;
    for (int64_t n = n0; n < n1; n += 4)
      xf.planes == 3 ? fixed24_avx2_tile<Block, 3>(xf, w, y, n, n1, row_bytes)
                     : fixed24_avx2_tile<Block, 1>(xf, w, y, n, n1, row_bytes);
  }
}
#endif

}  // namespace scratchlm
