// The elementwise half of causal attention with the probabilities materialised (nn/probs_attention.py), one pass
// over each row each way, for training at short T:
//
//   forward    P[r, j]  = exp(c s_j - m) * (1 / sum_{i <= t} exp(c s_i - m))  for j <= t, else 0 (bf16 out)
//              m = max_{i <= t} c s_i, t = r % T (the row's query position; rows are (..., query) with T queries)
//   backward   dS[r, j] = P[r, j] (dP[r, j] - D[r]) c                                           (bf16 out)
//              D[r] = sum_j dO[r, j] O[r, j] = sum_j P[r, j] dP[r, j], given
//
// c the score scale; s (fp32) the raw scores q . k. Each value rounds once to bf16 (round to nearest even, as
// torch's .to(torch.bfloat16)). The exponentials are softmax_exp.h's (within 2 ulp of exp). torch's ops do the
// same in five to eight passes over the (rows, T) tensors; at T = 256 those passes took more time than the
// attention's six matrix products (benchmarks/RESULTS.md, issue #26).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "softmax_exp.h"

namespace scratchlm {

inline uint16_t bf16_rne(float f) {  // fp32 -> bf16, round to nearest even (finite values)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

inline float bf16_f32(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// out[i] = bf16(v[i] * mul - sub) for i < n
inline void store_bf16(const float* v, float mul, uint16_t* out, int64_t n, float sub = 0.f) {
  int64_t i = 0;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  const __m256 m = _mm256_set1_ps(mul), d = _mm256_set1_ps(sub);
  const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  for (; i + 8 <= n; i += 8) {
    __m256i b = _mm256_castps_si256(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), m), d));
    b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(b, 16), one))), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));  // < 2^16
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
#endif
  for (; i < n; ++i) out[i] = bf16_rne(v[i] * mul - sub);
}

// n values of x (fp32 or bf16) as fp32 into out / n fp32 values v into out in its dtype (bf16: nearest even)
inline void widen_tile(const float* x, float* out, int64_t n) { std::memcpy(out, x, n * sizeof(float)); }
inline void widen_tile(const uint16_t* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_f32(x[i]);
}
inline void store_tile(const float* v, float* out, int64_t n) { std::memcpy(out, v, n * sizeof(float)); }
inline void store_tile(const float* v, uint16_t* out, int64_t n) { store_bf16(v, 1.0f, out, n); }

inline float load_f32(const float* x, int64_t i) { return x[i]; }
inline float load_f32(const uint16_t* x, int64_t i) { return bf16_f32(x[i]); }

// e[i] = x[i] * c in fp32 (x fp32 or bf16; e may be x itself) for i < n; returns the max of the products
template <typename T>
inline float widen_scale_max(const T* x, float* e, int64_t n, float c) {
  int64_t i = 0;
  float mx = -INFINITY;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  const __m256 cv = _mm256_set1_ps(c);
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) {
    __m256 v;
    if constexpr (std::is_same_v<T, float>) v = _mm256_loadu_ps(x + i);
    else v = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))), 16));
    v = _mm256_mul_ps(v, cv);
    _mm256_storeu_ps(e + i, v);
    m8 = _mm256_max_ps(m8, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  for (float v : lanes) mx = std::max(mx, v);
#endif
  for (; i < n; ++i) e[i] = load_f32(x, i) * c, mx = std::max(mx, e[i]);
  return mx;
}

// One row: e[0 .. n) the raw scores of its visible keys (scratch, overwritten) -> out[0 .. T) = bf16 softmax of
// c e, zeros past n
inline void softmax_row_bf16(float* e, int64_t n, float c, uint16_t* out, int64_t T) {
  const float mx = widen_scale_max(e, e, n, c);
  const float sum = exp_sum(e, n, mx);
  store_bf16(e, 1.0f / sum, out, n);
  std::fill(out + n, out + T, uint16_t{0});
}

// One row: p its bf16 probabilities, dp[0 .. n) its dP (scratch, overwritten), d its D -> out[0 .. T) = bf16
// c p (dp - d), zeros past n
inline void softmax_grad_row_bf16(const uint16_t* p, float* dp, float d, int64_t n, float c, uint16_t* out,
                                  int64_t T) {
  int64_t j = 0;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  const __m256 dv = _mm256_set1_ps(d);
  for (; j + 8 <= n; j += 8) {
    const __m256 pv = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j))), 16));
    _mm256_storeu_ps(dp + j, _mm256_mul_ps(pv, _mm256_sub_ps(_mm256_loadu_ps(dp + j), dv)));
  }
#endif
  for (; j < n; ++j) dp[j] = bf16_f32(p[j]) * (dp[j] - d);
  store_bf16(dp, c, out, n);
  std::fill(out + n, out + T, uint16_t{0});
}

// P (rows, T) bf16 from the raw scores s (rows, T) fp32: the causal softmax of c s, row r's query at r % T.
inline void causal_softmax_rows(const float* s, uint16_t* p, int64_t rows, int64_t T, float c) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(T);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r % T + 1;  // keys 0 .. t
      std::copy(s + r * T, s + r * T + n, e.data());
      softmax_row_bf16(e.data(), n, c, p + r * T, T);
    }
  });
}

// dS (rows, T) bf16 = P (dP - D[r]) c on and below the diagonal, 0 above.
inline void causal_softmax_grad_rows(const uint16_t* p, const float* dp, const float* d, uint16_t* ds, int64_t rows,
                                     int64_t T, float c) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> g(T);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r % T + 1;
      std::copy(dp + r * T, dp + r * T + n, g.data());
      softmax_grad_row_bf16(p + r * T, g.data(), d[r], n, c, ds + r * T, T);
    }
  });
}

}  // namespace scratchlm
