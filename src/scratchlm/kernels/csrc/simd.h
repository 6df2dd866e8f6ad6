// The few vector operations the decode kernels are written in, for three targets chosen at compile time:
//   AVX-512 (AVX512F + BW; -march=native on such a CPU)   VF = one __m512 (16 fp32 lanes)
//   AVX2 + FMA + F16C                                      VF = two __m256
//   portable (anything else, or -DSCRATCHLM_PORTABLE)      VF = float[16], loops the compiler vectorizes
// B16 is 16 bytes (an __m128i with SSSE3, else uint8_t[16]): ggml's quants are unpacked there (nibbles,
// 2-bit fields, high bits) and then widened to fp32 lanes. Every operation is exact integer work except
// vfma / vmul / vsum, so each block type (blocks.h) is written once and computes the same values on
// every target; the targets differ only in fp32 summation order.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if !defined(SCRATCHLM_PORTABLE) && defined(__AVX512F__) && defined(__AVX512BW__)
#define SCRATCHLM_AVX512 1
#elif !defined(SCRATCHLM_PORTABLE) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SCRATCHLM_AVX2 1
#endif
#if !defined(SCRATCHLM_PORTABLE) && defined(__SSSE3__)
#define SCRATCHLM_SSE_BYTES 1
#endif
#if defined(SCRATCHLM_AVX512) || defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_SSE_BYTES)
#include <immintrin.h>
#endif

namespace scratchlm {

// ggml-common.h's kvalues_iq4nl: the 16 levels an IQ4_NL / IQ4_XS index names
alignas(64) inline constexpr int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                         1,    13,   25,  38,  53,  69,  89,  113};
alignas(64) inline constexpr float KVALUES_IQ4NL_F[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                          1,    13,   25,  38,  53,  69,  89,  113};

inline float fp16_to_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if !defined(SCRATCHLM_PORTABLE) && defined(__F16C__)
  return _cvtsh_ss(h);  // exact widening
#else
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: value = mant * 2^-24, exact in fp32
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// A weight stream's lines ahead of use, into L2 (prefetcht1), not L1 (prefetcht0): an L1 prefetch holds one of the
// core's few L1 miss buffers until its line arrives. Zen 4 (2-core VM), b1 decode of the 1B Q4_K_M file, the two
// alternated in one process: 27 tok/s with prefetcht0, 34 with prefetcht1 (prefetcht2 the same; 3 or 4 tiles ahead
// instead of 2 slower). Zen 5 ran the earlier sessions' numbers with prefetcht0 (RESULTS.md).
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 2); }

// ---------------------------------------------------------------- 16 bytes
#if defined(SCRATCHLM_AVX2)
// AVX2: the 16 bytes twice, in both 128-bit halves of a __m256i (vbroadcasti128 is a plain load), so that
// widening them to 32-bit lanes (u8_f) is in-lane vpshufb work: vpmovzxbd ymm crosses lanes and costs three
// cycles of one shuffle pipe on Zen 3. Every byte operation acts on both copies alike.
struct B16 {
  __m256i v;
};
inline B16 load_b16(const uint8_t* p) {
  return {_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline void store_b16(uint8_t* p, B16 b) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(b.v)); }
inline B16 shr_and(B16 b, int n, uint8_t mask) {
  return {_mm256_and_si256(n ? _mm256_srli_epi16(b.v, n) : b.v, _mm256_set1_epi8(static_cast<char>(mask)))};
}
inline B16 shl_and(B16 b, int n, uint8_t mask) {
  return {_mm256_and_si256(n ? _mm256_slli_epi16(b.v, n) : b.v, _mm256_set1_epi8(static_cast<char>(mask)))};
}
inline B16 bor(B16 a, B16 b) { return {_mm256_or_si256(a.v, b.v)}; }
inline B16 bits_as_bytes(uint32_t m, uint8_t value) {
  const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)),
                                          _mm256_set_epi64x(0x0101010101010101LL, 0, 0x0101010101010101LL, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return {_mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit), _mm256_set1_epi8(static_cast<char>(value)))};
}
#elif defined(SCRATCHLM_SSE_BYTES)
struct B16 {
  __m128i v;
};
inline B16 load_b16(const uint8_t* p) { return {_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))}; }
inline void store_b16(uint8_t* p, B16 b) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b.v); }
// (b >> n) & mask per byte; mask must fit in 8 - n bits (a 16-bit shift then drops the neighbour's bits)
inline B16 shr_and(B16 b, int n, uint8_t mask) {
  return {_mm_and_si128(n ? _mm_srli_epi16(b.v, n) : b.v, _mm_set1_epi8(static_cast<char>(mask)))};
}
// (b << n) & mask per byte; mask must have no bit below n
inline B16 shl_and(B16 b, int n, uint8_t mask) {
  return {_mm_and_si128(n ? _mm_slli_epi16(b.v, n) : b.v, _mm_set1_epi8(static_cast<char>(mask)))};
}
inline B16 bor(B16 a, B16 b) { return {_mm_or_si128(a.v, b.v)}; }
// byte j = value where bit j of m (16 bits) is set, else 0
inline B16 bits_as_bytes(uint32_t m, uint8_t value) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return {_mm_maskz_set1_epi8(static_cast<__mmask16>(m), static_cast<char>(value))};
#else
  const __m128i rep = _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(m)), _mm_set_epi64x(0x0101010101010101LL, 0));
  const __m128i bit = _mm_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return {_mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(rep, bit), bit), _mm_set1_epi8(static_cast<char>(value)))};
#endif
}
#else
struct B16 {
  uint8_t v[16];
};
inline B16 load_b16(const uint8_t* p) {
  B16 b;
  std::memcpy(b.v, p, 16);
  return b;
}
inline void store_b16(uint8_t* p, B16 b) { std::memcpy(p, b.v, 16); }
inline B16 shr_and(B16 b, int n, uint8_t mask) {
  for (auto& x : b.v) x = static_cast<uint8_t>((x >> n) & mask);
  return b;
}
inline B16 shl_and(B16 b, int n, uint8_t mask) {
  for (auto& x : b.v) x = static_cast<uint8_t>((x << n) & mask);
  return b;
}
inline B16 bor(B16 a, B16 b) {
  for (int j = 0; j < 16; ++j) a.v[j] |= b.v[j];
  return a;
}
inline B16 bits_as_bytes(uint32_t m, uint8_t value) {
  B16 b;
  for (int j = 0; j < 16; ++j) b.v[j] = (m >> j) & 1 ? value : 0;
  return b;
}
#endif

// IQ4 indices (bytes 0..15) -> their int8 levels kvalues[q]
inline B16 lookup_iq4(B16 q) {
#if defined(SCRATCHLM_AVX2)
  return {_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(KVALUES_IQ4NL))), q.v)};
#elif defined(SCRATCHLM_SSE_BYTES)
  return {_mm_shuffle_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(KVALUES_IQ4NL)), q.v)};
#else
  for (auto& x : q.v) x = static_cast<uint8_t>(KVALUES_IQ4NL[x & 0x0f]);
  return q;
#endif
}

// bit `from` of every byte moved to bit `to` (the other bits 0)
inline B16 move_bit(B16 b, int from, int to) {
  const auto mask = static_cast<uint8_t>(1u << to);
  return to >= from ? shl_and(b, to - from, mask) : shr_and(b, from - to, mask);
}

// two bits `from`, `from + 1` of every byte moved to `to`, `to + 1`
inline B16 move_2bits(B16 b, int from, int to) {
  const auto mask = static_cast<uint8_t>(3u << to);
  return to >= from ? shl_and(b, to - from, mask) : shr_and(b, from - to, mask);
}

// ---------------------------------------------------------------- 16 fp32 lanes
#if defined(SCRATCHLM_AVX512) || defined(SCRATCHLM_AVX2)
// the sum of an __m256's 8 lanes (halves, then pairs, then the last two)
inline float hsum8(__m256 s) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// max |x_k| over n values (n % 8 == 0) with 8-lane registers; *bad: whether any is an inf or a NaN (v - v is NaN)
inline float abs_max8(const float* x, int64_t n, bool* bad) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float top = 0.0f;
  for (float l : lanes) top = std::max(top, l);
  *bad = _mm256_movemask_ps(nan) != 0;
  return top;
}
#endif
#if defined(SCRATCHLM_AVX512)
struct VF {
  __m512 v;
};
inline VF vzero() { return {_mm512_setzero_ps()}; }
inline VF vset1(float a) { return {_mm512_set1_ps(a)}; }
inline VF vset2(float a, float b) { return {_mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b))}; }
inline VF vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline VF vfma(VF a, VF b, VF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline VF vmul(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VF vadd(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VF vsub(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline float vsum(VF a) { return _mm512_reduce_add_ps(a.v); }
inline void vstore(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
inline VF u8_f(B16 b) { return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b.v))}; }
inline VF i8_f(B16 b) { return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b.v))}; }
inline VF nib_lo_f(B16 b) {
  return {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_cvtepu8_epi32(b.v), _mm512_set1_epi32(0x0f)))};
}
inline VF nib_hi_f(B16 b) { return {_mm512_cvtepi32_ps(_mm512_srli_epi32(_mm512_cvtepu8_epi32(b.v), 4))}; }
inline VF iq4_lo_f(B16 b) {
  const __m512i i = _mm512_and_si512(_mm512_cvtepu8_epi32(b.v), _mm512_set1_epi32(0x0f));
  return {_mm512_permutexvar_ps(i, _mm512_load_ps(KVALUES_IQ4NL_F))};
}
inline VF iq4_hi_f(B16 b) {
  const __m512i i = _mm512_srli_epi32(_mm512_cvtepu8_epi32(b.v), 4);
  return {_mm512_permutexvar_ps(i, _mm512_load_ps(KVALUES_IQ4NL_F))};
}
inline VF f16_f(const uint8_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline VF bf16_f(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
#elif defined(SCRATCHLM_AVX2)
struct VF {
  __m256 lo, hi;
};
inline VF vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline VF vset1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline VF vset2(float a, float b) { return {_mm256_set1_ps(a), _mm256_set1_ps(b)}; }
inline VF vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline VF vfma(VF a, VF b, VF c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline VF vmul(VF a, VF b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline VF vadd(VF a, VF b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline VF vsub(VF a, VF b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline float vsum(VF a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }
inline void vstore(float* p, VF a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
// Bytes -> 32-bit lanes: B16 holds the 16 bytes in both halves, so one in-lane vpshufb per 8 lanes puts byte j
// in the low byte (unsigned) or the top byte (signed, then an arithmetic shift) of lane j, the rest zero.
// vpshufb controls: bytes F .. F + 7 to the 8 lanes, in the low byte of each lane (BYTES_TO_LANES) or the
// top byte (BYTES_TO_LANES_TOP); -128 zeroes a byte
#define SCRATCHLM_LANE(f, j) f + j, -128, -128, -128
#define SCRATCHLM_LANE_TOP(f, j) -128, -128, -128, f + j
#define SCRATCHLM_LANES(L, f) L(f, 0), L(f, 1), L(f, 2), L(f, 3), L(f, 4), L(f, 5), L(f, 6), L(f, 7)
alignas(32) inline constexpr int8_t BYTES_TO_LANES[2][32] = {{SCRATCHLM_LANES(SCRATCHLM_LANE, 0)},
                                                              {SCRATCHLM_LANES(SCRATCHLM_LANE, 8)}};
alignas(32) inline constexpr int8_t BYTES_TO_LANES_TOP[2][32] = {{SCRATCHLM_LANES(SCRATCHLM_LANE_TOP, 0)},
                                                                  {SCRATCHLM_LANES(SCRATCHLM_LANE_TOP, 8)}};
#undef SCRATCHLM_LANES
#undef SCRATCHLM_LANE_TOP
#undef SCRATCHLM_LANE
inline __m256i load_ctl(const int8_t* c) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(c)); }
inline VF u8_f(B16 b) {
  return {_mm256_cvtepi32_ps(_mm256_shuffle_epi8(b.v, load_ctl(BYTES_TO_LANES[0]))),
          _mm256_cvtepi32_ps(_mm256_shuffle_epi8(b.v, load_ctl(BYTES_TO_LANES[1])))};
}
inline VF i8_f(B16 b) {
  return {_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_shuffle_epi8(b.v, load_ctl(BYTES_TO_LANES_TOP[0])), 24)),
          _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_shuffle_epi8(b.v, load_ctl(BYTES_TO_LANES_TOP[1])), 24))};
}
inline VF nib_lo_f(B16 b) { return u8_f(shr_and(b, 0, 0x0f)); }
inline VF nib_hi_f(B16 b) { return u8_f(shr_and(b, 4, 0x0f)); }
inline VF iq4_lo_f(B16 b) { return i8_f(lookup_iq4(shr_and(b, 0, 0x0f))); }
inline VF iq4_hi_f(B16 b) { return i8_f(lookup_iq4(shr_and(b, 4, 0x0f))); }
inline VF f16_f(const uint8_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}
inline VF bf16_f(const uint8_t* p) {
  const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16))};
}
#else
struct VF {
  float v[16];
};
inline VF vset1(float a) {
  VF r;
  for (auto& x : r.v) x = a;
  return r;
}
inline VF vzero() { return vset1(0.f); }
inline VF vset2(float a, float b) {
  VF r;
  for (int j = 0; j < 16; ++j) r.v[j] = j < 8 ? a : b;
  return r;
}
inline VF vload(const float* p) {
  VF r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
inline void vstore(float* p, VF a) { std::memcpy(p, a.v, sizeof(a.v)); }
inline VF vfma(VF a, VF b, VF c) {
  for (int j = 0; j < 16; ++j) c.v[j] = std::fma(a.v[j], b.v[j], c.v[j]);
  return c;
}
inline VF vmul(VF a, VF b) {
  for (int j = 0; j < 16; ++j) a.v[j] *= b.v[j];
  return a;
}
inline VF vadd(VF a, VF b) {
  for (int j = 0; j < 16; ++j) a.v[j] += b.v[j];
  return a;
}
inline VF vsub(VF a, VF b) {
  for (int j = 0; j < 16; ++j) a.v[j] -= b.v[j];
  return a;
}
inline float vsum(VF a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) a.v[j] += a.v[j + w];
  return a.v[0];
}
inline uint8_t b16_at(const B16& b, int j) {
#ifdef SCRATCHLM_SSE_BYTES
  alignas(16) uint8_t t[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), b.v);
  return t[j];
#else
  return b.v[j];
#endif
}
inline VF u8_f(B16 b) {
  VF r;
  for (int j = 0; j < 16; ++j) r.v[j] = static_cast<float>(b16_at(b, j));
  return r;
}
inline VF i8_f(B16 b) {
  VF r;
  for (int j = 0; j < 16; ++j) r.v[j] = static_cast<float>(static_cast<int8_t>(b16_at(b, j)));
  return r;
}
inline VF nib_lo_f(B16 b) { return u8_f(shr_and(b, 0, 0x0f)); }
inline VF nib_hi_f(B16 b) { return u8_f(shr_and(b, 4, 0x0f)); }
inline VF iq4_lo_f(B16 b) {
  VF r;
  for (int j = 0; j < 16; ++j) r.v[j] = KVALUES_IQ4NL_F[b16_at(b, j) & 0x0f];
  return r;
}
inline VF iq4_hi_f(B16 b) {
  VF r;
  for (int j = 0; j < 16; ++j) r.v[j] = KVALUES_IQ4NL_F[b16_at(b, j) >> 4];
  return r;
}
inline VF f16_f(const uint8_t* p) {
  VF r;
  for (int j = 0; j < 16; ++j) r.v[j] = fp16_to_f32(p + 2 * j);
  return r;
}
inline VF bf16_f(const uint8_t* p) {
  VF r;
  for (int j = 0; j < 16; ++j) {
    uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    std::memcpy(&r.v[j], &bits, 4);
  }
  return r;
}
#endif

// a . b over n floats (16-lane partial sums: a scalar fp32 loop is one long dependency chain the
// compiler may not reorder).
inline float dot_product(const float* a, const float* b, int64_t n) {
  int64_t j = 0;
  VF acc0 = vzero(), acc1 = vzero();
  for (; j + 32 <= n; j += 32) {
    acc0 = vfma(vload(a + j), vload(b + j), acc0);
    acc1 = vfma(vload(a + j + 16), vload(b + j + 16), acc1);
  }
  for (; j + 16 <= n; j += 16) acc0 = vfma(vload(a + j), vload(b + j), acc0);
  float tail = vsum(vadd(acc0, acc1));
  for (; j < n; ++j) tail += a[j] * b[j];
  return tail;
}

}  // namespace scratchlm

