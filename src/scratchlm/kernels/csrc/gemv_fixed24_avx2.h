// One batch row (decoding) of y = x @ W^T on the K-quants Q2_K-Q6_K with AVX2 (no VNNI): gemv_fixed24.h's method (x
// as 24-bit fixed point, every product and sum exact in integers, fp32 only after) in AVX2 instructions, with one
// power of two per 256-value super-block (FIXED24_GROUP: Fixed24X's AVX2 prepare), so a super-block's 8 sub-blocks
// are summed in integers before one conversion.
//
// Per 32-value sub-block t of quants q (unsigned bytes, 0..QMAX: Q2_K 3, Q3_K 7, Q4_K 15, Q5_K 31, Q6_K 63), its
// integer scale sc (Q4_K / Q5_K: 6-bit sc_t; Q2_K / Q3_K / Q6_K: the scales of its two 16-value groups) and x's
// digits a2, a1, a0 (X = 65536 a2 + 256 a1 + a0, Fixed24X's layout):
//   p_j  = vpmaddubsw(q, a_j)              16 x int16: q_2m a_j,2m + q_2m+1 a_j,2m+1, |p_j| <= 2 * 63 * 128 (no
//                                          saturation)
//   S_j += vpmaddwd(p_j, sc)               8 x int32 per plane, each lane 4 values' sc q a_j; after 8 sub-blocks
//                                          |S_j| <= 8 * 2 * 16128 * 128 < 2^26: exact
// then per super-block ((S_2 256 + S_1) 256 + S_0) in fp32 (three conversions and two FMAs by powers of two, each
// rounding once) times d 2^-k, and the offsets (Q4_K / Q5_K: -dmin m_t; Q2_K: -dmin m_g; Q3_K: -4 d sc_g; Q6_K:
// -32 d sc_g) times x~'s sums as gemv_fixed24.h. So y = F.linear(x~, dequantized W) up to fp32 rounding, x~ rounded per 256 values here
// (tests/kernels/test_fixed24.py models either group: fixed24_group()). The A8 row formats' one-plane form (x rounded
// to Q8_K, Fixed24X::prepare_q8: q8 for the digits, Q8_K's d for 2^-k): S_0 alone.
//
// Why: Zen 3 has two vector multiply pipes, which vpmaddubsw, vpmaddwd and the FMAs share. gemv_centered.h, the fp32
// form, spends ~17 vector ops per 32 weights (byte shuffles, int -> fp32 conversions, FMAs); a fixed-point form with
// a 2^-k per 32 values needs a conversion and an FMA per sub-block on top of the 6 multiplies; here per 32 weights:
// 3 vpmaddubsw, 3 vpmaddwd, 3 adds, the scale's vpshufb and the quants' unpacking, and ~25 ops per super-block and
// row. Zen 3, one core, in L3: Q2_K 1.9x gemv_centered.h's weights per second, Q3_K 1.8x, Q4_K 1.5x, Q5_K 1.7x, Q6_K
// 1.5x; two threads stream 20-25 GB/s of Q4_K-Q6_K (benchmarks/RESULTS.md).

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

// sums[j] += vpmaddwd(vpmaddubsw(q, digit plane j at d), sc) for the PLANES planes (3: a2, a1, a0, 64 bytes apart;
// 1: q8): each int32 lane adds 4 consecutive values' q a_j, each pair times its int16 scale lane
template <int PLANES>
[[gnu::always_inline]] inline void f24a_acc(__m256i q, const int8_t* d, __m256i sc, __m256i* sums) {
  for (int j = 0; j < PLANES; ++j) {
    const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 64 * j)));
    sums[j] = _mm256_add_epi32(sums[j], _mm256_madd_epi16(p, sc));
  }
}

// vpshufb masks over a register whose two 128-bit halves hold the same 8 int16 words: F24A_SPREAD[w] puts word w in
// every lane; F24A_SPLIT[g] word 2g in the low half (pairs of values 0-15) and word 2g + 1 in the high half (16-31)
#define SCRATCHLM_F24A_W8(w) 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, \
    2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1
alignas(32) inline constexpr uint8_t F24A_SPREAD[8][32] = {
    {SCRATCHLM_F24A_W8(0), SCRATCHLM_F24A_W8(0)}, {SCRATCHLM_F24A_W8(1), SCRATCHLM_F24A_W8(1)},
    {SCRATCHLM_F24A_W8(2), SCRATCHLM_F24A_W8(2)}, {SCRATCHLM_F24A_W8(3), SCRATCHLM_F24A_W8(3)},
    {SCRATCHLM_F24A_W8(4), SCRATCHLM_F24A_W8(4)}, {SCRATCHLM_F24A_W8(5), SCRATCHLM_F24A_W8(5)},
    {SCRATCHLM_F24A_W8(6), SCRATCHLM_F24A_W8(6)}, {SCRATCHLM_F24A_W8(7), SCRATCHLM_F24A_W8(7)}};
alignas(32) inline constexpr uint8_t F24A_SPLIT[4][32] = {
    {SCRATCHLM_F24A_W8(0), SCRATCHLM_F24A_W8(1)}, {SCRATCHLM_F24A_W8(2), SCRATCHLM_F24A_W8(3)},
    {SCRATCHLM_F24A_W8(4), SCRATCHLM_F24A_W8(5)}, {SCRATCHLM_F24A_W8(6), SCRATCHLM_F24A_W8(7)}};
#undef SCRATCHLM_F24A_W8

inline __m256i f24a_shuffle(__m256i words, const uint8_t* mask) {
  return _mm256_shuffle_epi8(words, _mm256_load_si256(reinterpret_cast<const __m256i*>(mask)));
}
inline __m128i f24a_load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// bit `from` of each byte of v moved to bit `to` (a 16-bit shift: the masked bit stays in its own byte), the rest 0
inline __m256i f24a_bit(__m256i v, int from, int to) {
  const __m256i s = from >= to ? _mm256_srl_epi16(v, _mm_cvtsi32_si128(from - to))
                               : _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - from));
  return _mm256_and_si256(s, f24a_bytes(1 << to));
}

// Per type: PAIR (x in Fixed24X's pair order: Q4_K, Q5_K) or index order (Q2_K, Q3_K, Q6_K); QMAX / SCMAX: the
// largest quant and |integer scale|; quants(p, t) = sub-block t's 32 values as unsigned bytes; Scales(p): d (the
// super-block's fp32 factor), scale(t): the int16 scale of each pair of sub-block t's values, offsets(sums): the 8
// lanes of the offsets t times x~'s sums (Fixed24X's k4o / g16o)
template <typename Block>
struct Fixed24Avx2;

struct F24aK4Scales {  // Q4_K / Q5_K: sub-block t's weights d sc_t q - dmin m_t
  __m128i b;   // bytes 0-7 sc_t, 8-15 m_t
  __m128 dm;   // lanes 0, 1: d, dmin
  __m256i sc;  // sc_t as words
  float d;
  // k4_unpack in SSE: per 16 bytes [d dmin | u0 | u1 | u2]: sc 0-3 = u0 & 0x3f.., sc 4-7 = (u2 & 0x0f..) | (u0 >> 6
  // & 3..) << 4, m 0-3 = u1 & 0x3f.., m 4-7 = (u2 >> 4 & 0x0f..) | (u1 >> 6 & 3..) << 4
  explicit F24aK4Scales(const uint8_t* p) {
    const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(z, _MM_SHUFFLE(3, 2, 3, 1)), _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(z, _MM_SHUFFLE(2, 2, 1, 1)), 2),
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    b = _mm_or_si128(lo, hi);
    dm = _mm_cvtph_ps(z);
    d = _mm_cvtss_f32(dm);
    sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
  }
  __m256i scale(int t) const { return f24a_shuffle(sc, F24A_SPREAD[t]); }
  __m256 offsets(const float* sums) const {  // k4o: sub-block t's sum in lane 8 + t; times -dmin
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b)));
    const __m256 ndmin = _mm256_broadcastss_ps(_mm_sub_ps(_mm_setzero_ps(), _mm_movehdup_ps(dm)));
    return _mm256_mul_ps(_mm256_mul_ps(m, _mm256_loadu_ps(sums + 8)), ndmin);
  }
};

template <>
struct Fixed24Avx2<Q4_KBlock> {  // sub-block t: nibble t % 2 of qs[32 (t / 2) + l]
  static constexpr bool PAIR = true;
  static constexpr int QMAX = 15, SCMAX = 63;
  using Scales = F24aK4Scales;
  static __m256i quants(const uint8_t* p, int t) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (t >> 1)));
    return _mm256_and_si256(t & 1 ? _mm256_srli_epi16(z, 4) : z, f24a_bytes(0x0f));
  }
};

template <>
struct Fixed24Avx2<Q5_KBlock> {  // sub-block t: nibble t % 2 of qs[32 (t / 2) + l] | bit t of qh[l] << 4
  static constexpr bool PAIR = true;
  static constexpr int QMAX = 31, SCMAX = 63;
  using Scales = F24aK4Scales;
  static __m256i quants(const uint8_t* p, int t) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 48 + 32 * (t >> 1)));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    return _mm256_or_si256(_mm256_and_si256(t & 1 ? _mm256_srli_epi16(z, 4) : z, f24a_bytes(0x0f)), f24a_bit(h, t, 4));
  }
};

// The index-order types (Q2_K / Q3_K / Q6_K): a scale per 16-value group g, its int16 sc_g for vpmaddwd and fp32
// offset factor o_g (what multiplies x~'s sum over the group, Fixed24X's g16o), from 16 signed bytes each
struct F24aG16Scales {
  float d;
  __m256i lo, hi;  // sc 0-7 / 8-15 as words in both halves
  __m256 o0, o1;   // o 0-7 / 8-15
  F24aG16Scales(__m128i sc, float d_, __m128i ob, float of) : d(d_) {
    lo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc));
    hi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_unpackhi_epi64(sc, sc)));
    const __m256 f = _mm256_set1_ps(of);
    o0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(ob)), f);
    o1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(ob, ob))), f);
  }
  // sub-block t (values 32t .. 32t + 31 = groups 2t, 2t + 1): sc_2t on the low half's pairs, sc_2t+1 on the high's
  __m256i scale(int t) const { return f24a_shuffle(t < 4 ? lo : hi, F24A_SPLIT[t & 3]); }
  __m256 offsets(const float* sums) const {  // g16o: group g's sum in lane g
    return _mm256_fmadd_ps(o0, _mm256_loadu_ps(sums), _mm256_mul_ps(o1, _mm256_loadu_ps(sums + 8)));
  }
};

template <>
struct Fixed24Avx2<Q2_KBlock> {  // [scales 16: sc | m << 4][qs 64][d][dmin]: sub-block t = 4h + j: bits 2j, 2j + 1
                                 // of qs[32h + l]; w = d sc_g q - dmin m_g
  static constexpr bool PAIR = false;
  static constexpr int QMAX = 3, SCMAX = 15;
  struct Scales : F24aG16Scales {
    explicit Scales(const uint8_t* p)
        : F24aG16Scales(_mm_and_si128(f24a_load16(p), _mm_set1_epi8(0x0f)), fp16_to_f32(p + 80),
                        _mm_and_si128(_mm_srli_epi16(f24a_load16(p), 4), _mm_set1_epi8(0x0f)), -fp16_to_f32(p + 82)) {}
  };
  static __m256i quants(const uint8_t* p, int t) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (t >> 2)));
    return _mm256_and_si256(_mm256_srl_epi16(z, _mm_cvtsi32_si128(2 * (t & 3))), f24a_bytes(0x03));
  }
};

template <>
struct Fixed24Avx2<Q3_KBlock> {  // [hmask 32][qs 64][scales 12][d]: sub-block t = 4h + j: bits 2j, 2j + 1 of
                                 // qs[32h + l] | bit t of hmask[l] << 2; w = d (sc_g - 32) (q - 4)
  static constexpr bool PAIR = false;
  static constexpr int QMAX = 7, SCMAX = 32;
  struct Scales : F24aG16Scales {
    explicit Scales(const uint8_t* p) : Scales(p, six(p)) {}
    Scales(const uint8_t* p, __m128i s) : F24aG16Scales(s, fp16_to_f32(p + 108), s, -4.0f * fp16_to_f32(p + 108)) {}
    static __m128i six(const uint8_t* p) {  // sc_g - 32
      alignas(16) uint8_t v[16];
      q3k_scales(p + 96, v);
      return _mm_sub_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(v)), _mm_set1_epi8(32));
    }
  };
  static __m256i quants(const uint8_t* p, int t) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * (t >> 2)));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(z, _mm_cvtsi32_si128(2 * (t & 3))), f24a_bytes(0x03)),
                           f24a_bit(h, t, 2));
  }
};

template <>
struct Fixed24Avx2<Q6_KBlock> {  // value 128j + 32g + l (sub-block t = 4j + g): nibble g / 2 of ql[64j + 32 (g % 2)
                                 // + l] | bits 2g, 2g + 1 of qh[32j + l] << 4; w = d sc_16 (q - 32) per 16 values
  static constexpr bool PAIR = false;
  static constexpr int QMAX = 63, SCMAX = 128;
  struct Scales : F24aG16Scales {
    explicit Scales(const uint8_t* p)
        : F24aG16Scales(f24a_load16(p + 192), fp16_to_f32(p + 208), f24a_load16(p + 192), -32.0f * fp16_to_f32(p + 208)) {}
  };
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

// y[n .. n + 4) (rows past n_end - 1 repeat the last row and are not written) for one batch row. Per row and
// super-block: each digit plane's int32 lanes summed over the 8 sub-blocks (scales folded in by vpmaddwd: |lane| <=
// 8 * 2 * (2 * 63 * 128) * 128 < 2^26), then fp32: (S2 65536 + S1 256 + S0) d 2^-k, and the offsets' lanes.
template <typename Block, int PLANES>
inline void fixed24_avx2_tile(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n, int64_t n_end,
                              int64_t row_bytes) {
  using F = Fixed24Avx2<Block>;
  constexpr int NR = 4;
  static_assert(8LL * 2 * (2 * F::QMAX * 128) * F::SCMAX < (int64_t{1} << 31), "|S_j| must fit int32");
  const auto [dig, xs, xo] = xf.order(F::PAIR);
  const uint8_t* row[NR];
  tile_rows<NR>(w, n, n_end, row_bytes, row);
  __m256 tot[NR];
  for (int r = 0; r < NR; ++r) tot[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < xf.K / 256; ++i) {
    const int8_t* d = dig + i * 256 * PLANES;
    const float xsc = xs[16 * i];  // 2^-k of the super-block (prepare_q8: Q8_K's d)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = row[r] + i * Block::BYTES;
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk + 2 * NR * row_bytes + o);  // the tile after next
      const typename F::Scales sc(blk);
      __m256i sums[PLANES];
      for (int j = 0; j < PLANES; ++j) sums[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        // sub-block t's digits: PAIR chunk 2 (t / 4) + t % 2, half (t % 4) / 2; index order chunk t / 2, half t % 2
        const int c = F::PAIR ? 2 * (t >> 2) + (t & 1) : t >> 1, h = F::PAIR ? (t & 3) >> 1 : t & 1;
        f24a_acc<PLANES>(F::quants(blk, t), d + c * 64 * PLANES + 32 * h, sc.scale(t), sums);
        for (int j = 0; j < PLANES; ++j) asm volatile("" : "+x"(sums[j]));
      }
      __m256 v = _mm256_cvtepi32_ps(sums[0]);
      if constexpr (PLANES == 3) {
        v = _mm256_fmadd_ps(v, _mm256_set1_ps(256.0f), _mm256_cvtepi32_ps(sums[1]));
        v = _mm256_fmadd_ps(v, _mm256_set1_ps(256.0f), _mm256_cvtepi32_ps(sums[2]));
      }
      tot[r] = _mm256_fmadd_ps(v, _mm256_set1_ps(sc.d * xsc), _mm256_add_ps(tot[r], sc.offsets(xo + 16 * i)));
    }
  }
  for (int r = 0; r < NR && n + r < n_end; ++r) y[n + r] = hsum8(tot[r]);
}

template <typename Block>  // (callers check has_fixed24<Block>())
void fixed24_rows(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  fixed24_tiles<Block>(xf, n0, n1, [&](auto p, int64_t n, int64_t rb) { fixed24_avx2_tile<Block, p()>(xf, w, y, n, n1, rb); });
}
#endif

}  // namespace scratchlm
