// One batch row (decoding) of y = x @ W^T on ggml blocks, AVX2: by sub-block sums of the centered integers
// instead of widening every weight. Types: Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K. The rest run gemv.h: Q4_1 and
// Q5_1 ran at 0.82x / 0.96x of it this way (two f16 fields per 32 values cost more than the widening saves);
// IQ4_NL, Q2_K, Q3_K, IQ4_XS are not measured. On AVX-512, Q5_K and Q6_K run gemv_centered512.h (the same sums,
// 64 bytes of quants at a time); the rest, and targets without AVX2, run gemv.h.
//
// A chunk c of 32 values (a 32-value block, a K-quant sub-block; Q6_K: two halves of 16, two scales) holds
// w = s_c q + t_c with small integers q, so
//   x . W[n] = sum_c ( s_c * sum_{i in c} (q_i - z) x_i  +  o_c * X_c ),   o_c = t_c + z s_c,   X_c = sum_{i in c} x_i
// with z the middle of q's range (8 for 4 bits, 16 for 5, 32 for 6, 0 for Q8_0's int8); Q8_0, Q4_0, Q5_0 and
// Q6_K have t = -z s, so no offsets. The same function as F.linear(x, dequantized W) up to fp32 rounding.
// Per 8 weights: one vpshufb (the centered byte to the top of a 32-bit lane), one vcvtdq2ps, one FMA with x;
// per chunk one FMA by s_c. gemv.h widens instead (w = q s + t, then x w: a second FMA per 8 weights, and
// sums of |w x| about twice as large for the offset types, so twice the fp32 rounding).
//
// Bit tricks, all exact: q - z lands in the top bits of a byte as two's complement ((q << (8 - bits)) ^ 0x80;
// Q8_0's int8 as it is), that byte at the top of an int32 lane, so the lane reads (q - z) 2^(32 - bits); the
// 2^(8 - bits) goes into s_c (a power of two) and the 2^24 into x (prepared once per call: SumsX). A 32-byte
// load puts values 0-15 of a chunk in the low register half and 16-31 in the high half; vpshufb stays within
// halves, so lane j of pass m holds value 4m + j (j < 4) or 16 + 4m + j - 4: SumsX holds each chunk of x in
// that order, so each pass reads x with one vector load.
//
// Measured (Zen 3, 2 threads, RESULTS.md): 1.15-1.3x gemv.h's weights per second streaming Q4_K / Q6_K matrices
// from DRAM, error against float64 0.6-0.9x gemv.h's; b1 decode 1.10x on the 1B Q4_K_M file, 1.04-1.13x on
// SmolLM2's Q4_0 / Q8_0 / Q6_K / Q4_K_M files.

#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "blocks.h"
#include "gemv_centered512.h"
#include "simd.h"

namespace scratchlm {

// x of one batch row prepared for the centered kernels: xp = x * 2^-24 with each 32-value chunk in pass order
// (see above; on AVX-512 x as it is), xs[c] = sum of chunk c of x (in index order), zeros past the last chunk up to a multiple of 8.
// xp is 64-byte aligned (a vector load of x that crosses a cache line costs AVX-512's kernel ~10%).
struct SumsX {
  std::vector<float> buf, xs;
  float* xp = nullptr;
  int64_t K = 0;

  void prepare(const float* x, int64_t K_) {
    K = K_;
    buf.resize(K + 16), xs.assign((K / 32 + 7) / 8 * 8, 0.0f);
    xp = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) / sizeof(float) % 16) % 16;
    for (int64_t c = 0; c < K / 32; ++c) {
      const float* src = x + 32 * c;
      float* dst = xp + 32 * c;
#if defined(SCRATCHLM_AVX512)
      std::copy(src, src + 32, dst);  // gemv_centered512.h reads x as it is
#else
      for (int m = 0; m < 4; ++m)
        for (int j = 0; j < 4; ++j) {
          dst[8 * m + j] = src[4 * m + j] * 0x1p-24f;
          dst[8 * m + 4 + j] = src[16 + 4 * m + j] * 0x1p-24f;
        }
#endif
      float s = 0.0f;
      for (int l = 0; l < 32; ++l) s += src[l];
      xs[c] = s;
    }
  }
};

// Whether one batch row of a type with a centered kernel takes it (the default) or gemv.h's widening: the
// module's set_centered, for benchmarks that compare the two in one process.
inline std::atomic<bool> centered_enabled{true};

// The block types with a centered kernel on this target (the rest, and other targets, run gemv.h).
template <typename Block>
constexpr bool has_centered() {
#if defined(SCRATCHLM_AVX512)
  return has_centered512<Block>();
#elif defined(SCRATCHLM_AVX2)
  return std::is_same_v<Block, Q8_0Block> || std::is_same_v<Block, Q4_0Block> || std::is_same_v<Block, Q5_0Block> ||
         std::is_same_v<Block, Q4_KBlock> || std::is_same_v<Block, Q5_KBlock> || std::is_same_v<Block, Q6_KBlock>;
#else
  return false;
#endif
}

#if defined(SCRATCHLM_AVX2)
// Per block type, over a group of 8 chunks (one K-quant super-block, or 8 consecutive 32-value blocks) at p:
// scales(p, s, o, nc) writes the first nc chunks' scales s (times 2^-(8 - bits)): s[c] for a whole chunk, or
// s[2c], s[2c + 1] for its halves (HALVES), and their offsets o[c] (OFFSETS); bytes(p, c) is chunk c's 32
// centered values, top-aligned.
template <typename Block>
struct Centered;

// The 32-value blocks: chunk c is block c of the group. Q4_0 / Q5_0 hold value j in the low nibble
// of byte j and value j + 16 in the high nibble: one 16-byte load in both register halves, the low half's
// nibbles moved up by a per-lane shift, gives values 0-15 | 16-31 as the pass order wants.
inline __m256i nibbles_top(const uint8_t* qs) {  // the nibble of value j at the top of byte j (low 4 bits 0)
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_sllv_epi32(b, _mm256_setr_epi32(4, 4, 4, 4, 0, 0, 0, 0)),
                          _mm256_set1_epi8(static_cast<char>(0xf0)));
}

// bit j of the u32 at qh at bit 7 of byte j (the other bits 0)
inline __m256i high_bits(const uint8_t* qh) {
  const __m256i h = _mm256_set1_epi32(static_cast<int>(load_u32(qh)));
  const __m256i spread = _mm256_shuffle_epi8(h, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                                   2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(static_cast<char>(0x80)));
}

// scale d (times 2^-shift) of each 32-value block of the group (these types have no offsets)
template <int64_t BYTES, int SHIFT>
inline void block32_group_scales(const uint8_t* p, float* s, int nc) {
  for (int c = 0; c < nc; ++c) s[c] = fp16_to_f32(p + c * BYTES) * (1.0f / static_cast<float>(1 << SHIFT));
}

template <>
struct Centered<Q8_0Block> {  // [d f16][32 x int8]: w = d q
  static constexpr bool HALVES = false, OFFSETS = false;
  static void scales(const uint8_t* p, float* s, float*, int nc) { block32_group_scales<34, 0>(p, s, nc); }
  static __m256i bytes(const uint8_t* p, int c) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 34 * c + 2));
  }
};

template <>
struct Centered<Q4_0Block> {  // [d f16][16 bytes]: w = d (q - 8)
  static constexpr bool HALVES = false, OFFSETS = false;
  static void scales(const uint8_t* p, float* s, float*, int nc) { block32_group_scales<18, 4>(p, s, nc); }
  static __m256i bytes(const uint8_t* p, int c) {
    return _mm256_xor_si256(nibbles_top(p + 18 * c + 2), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// Q5_0: the nibble to bits 3-6, bit j of qh to bit 7, minus 16
inline __m256i q5_top(const uint8_t* qh, const uint8_t* qs) {
  const __m256i nib = _mm256_and_si256(_mm256_srli_epi16(nibbles_top(qs), 1), _mm256_set1_epi8(0x78));
  return _mm256_xor_si256(_mm256_or_si256(nib, high_bits(qh)), _mm256_set1_epi8(static_cast<char>(0x80)));
}

template <>
struct Centered<Q5_0Block> {  // [d f16][qh u32][16 bytes]: w = d (q - 16)
  static constexpr bool HALVES = false, OFFSETS = false;
  static void scales(const uint8_t* p, float* s, float*, int nc) { block32_group_scales<22, 3>(p, s, nc); }
  static __m256i bytes(const uint8_t* p, int c) { return q5_top(p + 22 * c + 2, p + 22 * c + 6); }
};

// Q4_K / Q5_K: s_c = d sc_c 2^-SHIFT, o_c = -(dmin m_c) + Z d sc_c (k4_scales8's 8 scales, then 8 offsets)
template <int SHIFT, int Z>
inline void k4_centered_scales(const uint8_t* p, float* s, float* o) {
  alignas(32) float v[16];
  k4_scales8(p, v);
  const __m256 sc = _mm256_load_ps(v);
  _mm256_store_ps(s, _mm256_mul_ps(sc, _mm256_set1_ps(1.0f / static_cast<float>(1 << SHIFT))));
  _mm256_store_ps(o, _mm256_fmadd_ps(sc, _mm256_set1_ps(static_cast<float>(Z)), _mm256_load_ps(v + 8)));
}

template <>
struct Centered<Q4_KBlock> {
  static constexpr bool HALVES = false, OFFSETS = true;
  static void scales(const uint8_t* p, float* s, float* o, int) { k4_centered_scales<4, 8>(p, s, o); }
  static __m256i bytes(const uint8_t* p, int c) {  // nibble c % 2 of qs[32 (c / 2) + l], minus 8, << 4
    const __m256i a = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (c >> 1))),
                                       _mm256_set1_epi8(static_cast<char>(0x88)));
    const __m256i top = _mm256_set1_epi8(static_cast<char>(0xf0));
    return c & 1 ? _mm256_and_si256(a, top) : _mm256_and_si256(_mm256_slli_epi16(a, 4), top);
  }
};

template <>
struct Centered<Q5_KBlock> {
  static constexpr bool HALVES = false, OFFSETS = true;
  static void scales(const uint8_t* p, float* s, float* o, int) { k4_centered_scales<3, 16>(p, s, o); }
  static __m256i bytes(const uint8_t* p, int c) {  // (nibble | bit c of qh[l] << 4) - 16, << 3
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 48 + 32 * (c >> 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    const __m256i nib = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(qs, 1) : _mm256_slli_epi16(qs, 3),
                                         _mm256_set1_epi8(0x78));
    const __m128i shift = _mm_cvtsi32_si128(7 - c);
    const __m256i hb = _mm256_and_si256(_mm256_sll_epi16(qh, shift), _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_xor_si256(_mm256_or_si256(nib, hb), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

template <>
struct Centered<Q6_KBlock> {
  static constexpr bool HALVES = true, OFFSETS = false;
  static void scales(const uint8_t* p, float* s, float*, int) {  // 16 int8 scales times d: w = d sc (q - 32)
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
    const __m256 d = _mm256_set1_ps(fp16_to_f32(p + 208) * 0x1p-2f);
    _mm256_store_ps(s, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
    _mm256_store_ps(s + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d));
  }
  // chunk c = 4h + g: nibble g / 2 of ql[64 h + 32 (g % 2) + l] | bits 2g, 2g + 1 of qh[32 h + l] << 4, minus
  // 32, << 2: the nibble to bits 2-5, the two bits to 6-7
  static __m256i bytes(const uint8_t* p, int c) {
    const int h = c >> 2, g = c & 3;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
    const __m256i nib = _mm256_and_si256(g >> 1 ? _mm256_srli_epi16(ql, 2) : _mm256_slli_epi16(ql, 2),
                                         _mm256_set1_epi8(0x3c));
    const __m256i hb = _mm256_and_si256(_mm256_sll_epi16(qh, _mm_cvtsi32_si128(6 - 2 * g)),
                                        _mm256_set1_epi8(static_cast<char>(0xc0)));
    return _mm256_xor_si256(_mm256_or_si256(nib, hb), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// vpshufb controls: pass m puts bytes 4m .. 4m + 3 of each register half at the top of lanes 0-3 / 4-7
#define SCRATCHLM_TOP4(m) -128, -128, -128, 4 * m, -128, -128, -128, 4 * m + 1, -128, -128, -128, 4 * m + 2, \
                          -128, -128, -128, 4 * m + 3
alignas(32) inline constexpr int8_t CENTERED_PASS[4][32] = {{SCRATCHLM_TOP4(0), SCRATCHLM_TOP4(0)},
                                                            {SCRATCHLM_TOP4(1), SCRATCHLM_TOP4(1)},
                                                            {SCRATCHLM_TOP4(2), SCRATCHLM_TOP4(2)},
                                                            {SCRATCHLM_TOP4(3), SCRATCHLM_TOP4(3)}};
#undef SCRATCHLM_TOP4

inline __m256 centered_lanes(__m256i v, int m) {
  const __m256i ctl = _mm256_load_si256(reinterpret_cast<const __m256i*>(CENTERED_PASS[m]));
  return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, ctl));
}

// tot += s_c * sum over chunk c of (q - z) x: four passes of 8 lanes (x in pass order at xc), then one FMA by
// the chunk's scale (HALVES: the low lanes' half and the high lanes' half)
template <typename C>
inline void chunk_into(const uint8_t* g, int c, const float* xc, const float* s, __m256& tot) {
  const __m256i v = C::bytes(g, c);
  __m256 p = _mm256_mul_ps(centered_lanes(v, 0), _mm256_loadu_ps(xc));
  p = _mm256_fmadd_ps(centered_lanes(v, 1), _mm256_loadu_ps(xc + 8), p);
  p = _mm256_fmadd_ps(centered_lanes(v, 2), _mm256_loadu_ps(xc + 16), p);
  p = _mm256_fmadd_ps(centered_lanes(v, 3), _mm256_loadu_ps(xc + 24), p);
  const __m256 sc = C::HALVES ? _mm256_set_m128(_mm_broadcast_ss(s + 2 * c + 1), _mm_broadcast_ss(s + 2 * c))
                              : _mm256_broadcast_ss(s + c);
  tot = _mm256_fmadd_ps(p, sc, tot);
}

// y[n .. n + NR) for one batch row; each row's sum is one 8-lane chain (per group of 8 chunks: the offsets,
// then each chunk's scaled sum in order), reduced at the end. A 32-value type's rows may end in a partial group.
template <typename Block, int NR>
inline void centered_tile(const SumsX& sx, const uint8_t* w, float* y, int64_t n, int64_t row_bytes) {
  using C = Centered<Block>;
  constexpr int64_t GROUP_BYTES = Block::BYTES * (256 / Block::QK);
  __m256 tot[NR];
  for (int r = 0; r < NR; ++r) tot[r] = _mm256_setzero_ps();
  const int64_t chunks = sx.K / 32;
  for (int64_t c0 = 0; c0 < chunks; c0 += 8) {
    const int nc = static_cast<int>(std::min<int64_t>(8, chunks - c0));
    const int64_t at = c0 / 8 * GROUP_BYTES;
    alignas(32) float s[NR][16];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* g = w + (n + r) * row_bytes + at;
      for (int64_t o = 0; o < GROUP_BYTES; o += 64) prefetch(g + 2 * NR * row_bytes + o);  // the tile after next
      alignas(32) float off[8];
      C::scales(g, s[r], off, nc);
      if constexpr (C::OFFSETS)
        tot[r] = _mm256_fmadd_ps(_mm256_load_ps(off), _mm256_loadu_ps(sx.xs.data() + c0), tot[r]);
    }
    const float* xg = sx.xp + 32 * c0;
    if (nc == 8) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        for (int r = 0; r < NR; ++r) chunk_into<C>(w + (n + r) * row_bytes + at, c, xg + 32 * c, s[r], tot[r]);
    } else {
      for (int c = 0; c < nc; ++c)
        for (int r = 0; r < NR; ++r) chunk_into<C>(w + (n + r) * row_bytes + at, c, xg + 32 * c, s[r], tot[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[n + r] = hsum8(tot[r]);
}

// y[n] for rows n in [n0, n1), one batch row (sx prepared from it)
template <typename Block>
void centered_rows(const SumsX& sx, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  constexpr int NR = 4;
  const int64_t row_bytes = (sx.K / Block::QK) * Block::BYTES;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) centered_tile<Block, NR>(sx, w, y, n, row_bytes);
  for (; n < n1; ++n) centered_tile<Block, 1>(sx, w, y, n, row_bytes);
}
#elif defined(SCRATCHLM_AVX512)
template <typename Block>
void centered_rows(const SumsX& sx, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  centered512_rows<Block>(sx.xp, sx.xs.data(), sx.K, w, y, n0, n1);
}
#else
// no centered kernel on this target (has_centered is false): a declaration for matrix_ref.h's dispatch to name
template <typename Block>
void centered_rows(const SumsX&, const uint8_t*, float*, int64_t, int64_t) {}
#endif

}  // namespace scratchlm
