// The integer dot products of the A8 row kernels (gemv_a8_blocks.h) over simd.h's B16 bytes: AVX512-VNNI
// (vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd), or a portable loop; 8-lane fp32 / int32 vectors around them.

#pragma once

#include "simd.h"

namespace scratchlm {

// ---------------------------------------------------------------- integer dots (the A8 kernels)
// VF8: 8 fp32 lanes, VI8: 8 int32 lanes. idot<SIGNED_W>: 32 weight quants (lo = values 0..15, hi = 16..31;
// unsigned <= 128, or int8) times 32 int8 activations x: lanes 0..3 hold partial sums of lo . x[0..15] (lane j:
// bytes 4j..4j+3), lanes 4..7 of hi . x[16..31]; exact integers (|lane| <= 4 * 128 * 127).
#if defined(SCRATCHLM_AVX512) || defined(SCRATCHLM_AVX2)
struct VF8 {
  __m256 v;
};
inline VF8 vzero8() { return {_mm256_setzero_ps()}; }
inline VF8 vset1_8(float a) { return {_mm256_set1_ps(a)}; }
inline VF8 vpair8(float lo, float hi) { return {_mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo))}; }
inline VF8 vfma8(VF8 a, VF8 b, VF8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline VF8 vadd8(VF8 a, VF8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VF8 vmul8(VF8 a, VF8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline float vsum8(VF8 a) { return hsum8(a.v); }
inline __m256i idot_raw(__m256i w, __m256i x) {  // w unsigned bytes, x int8
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));  // pairs <= 2 * 128 * 127: no saturation
#endif
}
struct VI8 {
  __m256i v;
};
inline VF8 vcvt8(VI8 a) { return {_mm256_cvtepi32_ps(a.v)}; }
template <bool SIGNED_W>
inline VI8 idot(B16 lo, B16 hi, const int8_t* x) {
#if defined(SCRATCHLM_AVX2)
  const __m256i w = _mm256_blend_epi32(lo.v, hi.v, 0xf0);  // B16 holds its bytes in both halves (simd.h)
#else
  const __m256i w = _mm256_set_m128i(hi.v, lo.v);
#endif
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  if constexpr (SIGNED_W) return {idot_raw(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w))};  // |w| . (x sign(w))
  return {idot_raw(w, xv)};
}
// Four chunks' dots -> [A(c0) A(c1) A(c2) A(c3) | B(c0) B(c1) B(c2) B(c3)] as fp32 (A: lanes 0..3 summed,
// the lo group; B: lanes 4..7, the hi group), exact integer sums
inline VF8 group_sums(VI8 c0, VI8 c1, VI8 c2, VI8 c3) {
  return {_mm256_cvtepi32_ps(_mm256_hadd_epi32(_mm256_hadd_epi32(c0.v, c1.v), _mm256_hadd_epi32(c2.v, c3.v)))};
}
// p[0], p[2], p[4], p[6], p[1], p[3], p[5], p[7]: the scales of group_sums' lanes
inline VF8 vload8_eo(const float* p) {
  return {_mm256_permutevar8x32_ps(_mm256_loadu_ps(p), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7))};
}
#else
struct VF8 {
  float v[8];
};
inline VF8 vset1_8(float a) {
  VF8 r;
  for (auto& x : r.v) x = a;
  return r;
}
inline VF8 vzero8() { return vset1_8(0.f); }
inline VF8 vpair8(float lo, float hi) {
  VF8 r;
  for (int j = 0; j < 8; ++j) r.v[j] = j < 4 ? lo : hi;
  return r;
}
inline VF8 vfma8(VF8 a, VF8 b, VF8 c) {
  for (int j = 0; j < 8; ++j) c.v[j] = std::fma(a.v[j], b.v[j], c.v[j]);
  return c;
}
inline VF8 vadd8(VF8 a, VF8 b) {
  for (int j = 0; j < 8; ++j) a.v[j] += b.v[j];
  return a;
}
inline VF8 vmul8(VF8 a, VF8 b) {
  for (int j = 0; j < 8; ++j) a.v[j] *= b.v[j];
  return a;
}
inline float vsum8(VF8 a) {
  for (int w = 4; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) a.v[j] += a.v[j + w];
  return a.v[0];
}
struct VI8 {
  int32_t v[8];
};
inline VF8 vcvt8(VI8 a) {
  VF8 r;
  for (int j = 0; j < 8; ++j) r.v[j] = static_cast<float>(a.v[j]);
  return r;
}
template <bool SIGNED_W>
inline VI8 idot(B16 lo, B16 hi, const int8_t* x) {
  VI8 r;
  for (int j = 0; j < 8; ++j) {
    const B16& w = j < 4 ? lo : hi;
    int32_t s = 0;
    for (int t = 0; t < 4; ++t) {
      const uint8_t byte = b16_at(w, 4 * (j % 4) + t);
      s += (SIGNED_W ? static_cast<int32_t>(static_cast<int8_t>(byte)) : static_cast<int32_t>(byte)) * x[4 * j + t];
    }
    r.v[j] = s;
  }
  return r;
}
inline VF8 group_sums(VI8 c0, VI8 c1, VI8 c2, VI8 c3) {
  const VI8* c[4] = {&c0, &c1, &c2, &c3};
  VF8 r;
  for (int i = 0; i < 4; ++i) {
    r.v[i] = static_cast<float>(c[i]->v[0] + c[i]->v[1] + c[i]->v[2] + c[i]->v[3]);
    r.v[4 + i] = static_cast<float>(c[i]->v[4] + c[i]->v[5] + c[i]->v[6] + c[i]->v[7]);
  }
  return r;
}
inline VF8 vload8_eo(const float* p) {
  VF8 r;
  for (int j = 0; j < 4; ++j) r.v[j] = p[2 * j], r.v[4 + j] = p[2 * j + 1];
  return r;
}
#endif

}  // namespace scratchlm
