// The SwiGLU gate for training (nn/fused_gate.py), one pass each way over a (gate, up) pair of equal shapes:
//
//   forward    h = silu(a) b = a s b,                      s = sigmoid(a) = 1 / (1 + exp(-a))
//   backward   da = dh b s (1 + a (1 - s))   (= dh b silu'(a))        db = dh a s
//
// a, b, dh fp32 or bf16 (one dtype); math in fp32, every output rounded once to that dtype (bf16: nearest even, as
// torch's .to(torch.bfloat16)). torch's eager ops take three passes forward (silu, multiply) and five back, each
// rounding to bf16 under autocast; at the llama-small training shape they were ~4% of a bf16 step. exp through
// softmax_exp.h's exp8 (within 2 ulp of exp; it caps its argument at 88.4, so s stays a finite ~0 for very negative
// a); targets without AVX2 use std::exp.

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "causal_softmax.h"
#include "softmax_exp.h"

namespace scratchlm {

constexpr int64_t GATE_TILE = 256;

// s[i] = 1 / (1 + exp(-a[i])) for i < n
inline void sigmoid_tile(const float* a, float* s, int64_t n) {
  int64_t i = 0;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(a + i)));
    _mm256_storeu_ps(s + i, _mm256_div_ps(one, _mm256_add_ps(one, e)));
  }
#endif
  for (; i < n; ++i) s[i] = 1.0f / (1.0f + std::exp(-a[i]));
}

#if defined(SCRATCHLM_AVX512)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(uint16_t* p, __m512 v) {  // round to nearest even, as bf16_rne
  __m512i b = _mm512_castps_si512(v);
  b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1))));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16)));
}
inline __m512 sigmoid16(__m512 a) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), a))));
}
#endif

// h = silu(a) b over elements [i0, i1); returns the first element it left to the scalar / tile code
template <typename T>
int64_t silu_gate_lanes(const T* a, const T* b, T* h, int64_t i0, int64_t i1) {
#if defined(SCRATCHLM_AVX512)
  for (; i0 + 16 <= i1; i0 += 16) {
    const __m512 va = load16(a + i0);
    store16(h + i0, _mm512_mul_ps(_mm512_mul_ps(va, sigmoid16(va)), load16(b + i0)));
  }
#endif
  return i0;
}

template <typename T>
int64_t silu_gate_grad_lanes(const T* a, const T* b, const T* dh, T* da, T* db, int64_t i0, int64_t i1) {
#if defined(SCRATCHLM_AVX512)
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i0 + 16 <= i1; i0 += 16) {
    const __m512 va = load16(a + i0), vb = load16(b + i0), vd = load16(dh + i0);
    const __m512 s = sigmoid16(va), sa = _mm512_mul_ps(va, s);
    const __m512 dsilu = _mm512_add_ps(s, _mm512_mul_ps(sa, _mm512_sub_ps(one, s)));
    store16(da + i0, _mm512_mul_ps(_mm512_mul_ps(vd, vb), dsilu));
    store16(db + i0, _mm512_mul_ps(vd, sa));
  }
#endif
  return i0;
}

template <typename T>
void silu_gate(const T* a, const T* b, T* h, int64_t n) {
  at::parallel_for(0, (n + GATE_TILE - 1) / GATE_TILE, 16, [&](int64_t t0, int64_t t1) {
    alignas(64) float fa[GATE_TILE], fb[GATE_TILE], s[GATE_TILE];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t end = std::min(n, (t + 1) * GATE_TILE);
      const int64_t i0 = silu_gate_lanes(a, b, h, t * GATE_TILE, end), m = end - i0;
      if (m == 0) continue;
      widen_tile(a + i0, fa, m);
      widen_tile(b + i0, fb, m);
      sigmoid_tile(fa, s, m);
      for (int64_t i = 0; i < m; ++i) s[i] = fa[i] * s[i] * fb[i];
      store_tile(s, h + i0, m);
    }
  });
}

template <typename T>
void silu_gate_grad(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n) {
  at::parallel_for(0, (n + GATE_TILE - 1) / GATE_TILE, 16, [&](int64_t t0, int64_t t1) {
    alignas(64) float fa[GATE_TILE], fb[GATE_TILE], fd[GATE_TILE], s[GATE_TILE];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t end = std::min(n, (t + 1) * GATE_TILE);
      const int64_t i0 = silu_gate_grad_lanes(a, b, dh, da, db, t * GATE_TILE, end), m = end - i0;
      if (m == 0) continue;
      widen_tile(a + i0, fa, m);
      widen_tile(b + i0, fb, m);
      widen_tile(dh + i0, fd, m);
      sigmoid_tile(fa, s, m);
      for (int64_t i = 0; i < m; ++i) {
        const float sa = fa[i] * s[i];                               // silu(a)
        const float ga = fd[i] * fb[i] * (s[i] + sa * (1.0f - s[i]));  // dh b silu'(a)
        fb[i] = fd[i] * sa;                                          // db
        fa[i] = ga;                                                  // da
      }
      store_tile(fa, da + i0, m);
      store_tile(fb, db + i0, m);
    }
  });
}

}  // namespace scratchlm
