// The FFN gate of the decode step (llama_step.h): f = act(g) * u over a row of F values, act one of
//   SiLU        g sigma(g)                                = g / (1 + exp(-g))
//   GELU        g Phi(g)                                  = 0.5 g (1 + erf(g / sqrt 2))
//   GELU tanh   0.5 g (1 + tanh(k (g + 0.044715 g^3)))    = g / (1 + exp(-2 k (g + 0.044715 g^3))),  k = sqrt(2 / pi)
// (1 + tanh(z) = 2 / (1 + exp(-2z)): the same function without tanh's cancellation near 0). SiLU and GELU tanh run 8
// lanes at a time through softmax_exp.h's exp8 (within 2 ulp of exp); scalar std::exp / std::tanh one value at a time
// was 12-17% of a prompt's time on a 1B Llama / Gemma-3 (a single thread while the other waited). GELU (erf) stays
// scalar. Targets without AVX2 run the scalar forms.

#pragma once

#include <cmath>
#include <cstdint>

#include "simd.h"
#include "softmax_exp.h"

namespace scratchlm {

constexpr int64_t ACT_SILU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2;
constexpr float GELU_K = 0.79788456080286536f;  // sqrt(2 / pi)

inline float activation(float g, int64_t act) {
  if (act == ACT_SILU) return g / (1.0f + std::exp(-g));
  if (act == ACT_GELU) return 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f));
  return g / (1.0f + std::exp(-2.0f * GELU_K * (g + 0.044715f * g * g * g)));
}

// f[j] = act(g[j]) * u[j] for j < n
inline void gate_row(const float* g, const float* u, float* f, int64_t n, int64_t act) {
  int64_t j = 0;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  if (act == ACT_SILU || act == ACT_GELU_TANH) {
    const __m256 one = _mm256_set1_ps(1.0f), c3 = _mm256_set1_ps(0.044715f), m2k = _mm256_set1_ps(-2.0f * GELU_K);
    for (; j + 8 <= n; j += 8) {
      const __m256 gv = _mm256_loadu_ps(g + j);
      const __m256 z = act == ACT_SILU
                           ? _mm256_sub_ps(_mm256_setzero_ps(), gv)
                           : _mm256_mul_ps(m2k, _mm256_add_ps(gv, _mm256_mul_ps(c3, _mm256_mul_ps(gv, _mm256_mul_ps(gv, gv)))));
      const __m256 a = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(z)));  // exp8 caps z at 88.4: a finite ~0
      _mm256_storeu_ps(f + j, _mm256_mul_ps(a, _mm256_loadu_ps(u + j)));
    }
  }
#endif
  for (; j < n; ++j) f[j] = activation(g[j], act) * u[j];
}

}  // namespace scratchlm
