// The exponentials of a softmax row, 8 lanes at a time (the decode step's attention: one exp per cached key
// and head, ~1M per token at 4k tokens of context for a 30-layer, 9-head model; std::exp one at a time was
// most of the step's attention time).
//
//   exp(x) = 2^n exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2 / 2, ln2 / 2]
//   exp(r) ~ 1 + r + r^2 (1/2 + r (1/6 + r (1/24 + r (1/120 + r (1/720 + r / 5040)))))
// with ln 2 split in two constants (C1 exact in a few bits, so n C1 is exact) and Cephes' expf coefficients
// (a minimax fit: within 2 ulp of the correctly rounded exp over the range, tested against torch.exp in
// tests/kernels/test_softmax_exp.py). Inputs below -87.3 (and -inf: a masked key) give exactly 0, as exp does
// at fp32 underflow. Where the CPU has no AVX2 the row runs through std::exp.

#pragma once

#include <cmath>
#include <cstdint>

#include "simd.h"

namespace scratchlm {

constexpr float EXP_UNDERFLOW = -87.33654f;  // below this exp(x) is 0 here (the lanes and the scalar tail alike)
constexpr float EXP_OVERFLOW = 88.3762626647949f, EXP_LOG2E = 1.44269504088896341f;
constexpr float EXP_C1 = 0.693359375f, EXP_C2 = -2.12194440e-4f;  // ln 2 = C1 + C2, n C1 exact
constexpr float EXP_P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};  // Cephes' expf, highest first

#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(EXP_UNDERFLOW);
  const __m256 live = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);  // below: exp underflows to 0 (and -inf, NaN-free)
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(EXP_OVERFLOW));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), x);  // x - n C1 (exact)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C2), r);         // - n C2
  __m256 y = _mm256_set1_ps(EXP_P[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), live);  // y 2^n, 0 where x underflows
}
#endif

#if defined(SCRATCHLM_AVX512)
// exp8's steps on 16 lanes (the same constants, the same results lane for lane)
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(EXP_UNDERFLOW);
  const __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(EXP_OVERFLOW));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_C1), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_C2), r);
  __m512 y = _mm512_set1_ps(EXP_P[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(live, y, _mm512_castsi512_ps(e));
}
#endif

// p[i] <- exp(p[i] - mx) for i < n; returns their sum.
inline float exp_sum(float* p, int64_t n, float mx) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), m));
    _mm256_storeu_ps(p + i, v);
    acc = _mm256_add_ps(acc, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float v : lanes) sum += v;
#endif
  for (; i < n; ++i) {
    const float x = p[i] - mx;
    sum += (p[i] = x < EXP_UNDERFLOW ? 0.f : std::exp(x));
  }
  return sum;
}

}  // namespace scratchlm
