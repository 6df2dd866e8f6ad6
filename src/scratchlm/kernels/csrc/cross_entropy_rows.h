// The per-row half of the fused LM-head cross entropy (train/chunked_ce.py), one row in cache at a time:
//
//   lse    = m + log sum_v exp(x_v - m),   m = max_v x_v
//   loss   = (1 - eps) (lse - x_y) + eps (lse - mean_v x_v) + z lse^2                 (0 on an ignored row)
//   dx_v   = p_v (1 + 2 z lse) - (1 - eps) [v = y] - eps / V,   p = exp(x - m) / sum   (0 on an ignored row)
//
// x (rows, V) holds the logits, fp32 or bf16 (the head's product under bf16 autocast), and is overwritten with dx
// in the same dtype (bf16: rounded to nearest even, as torch's .to(torch.bfloat16)). Each row is read once into an
// fp32 buffer (max and sum on the way), exponentiated there (softmax_exp.h), and written back once: torch's ops
// took about eight passes over the (rows, V) tensor, two of them dtype conversions (benchmarks/RESULTS.md,
// issue #26).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "causal_softmax.h"
#include "simd.h"
#include "softmax_exp.h"

namespace scratchlm {

inline void store_row(const float* v, float* out, int64_t n, float coef, float sub) {
  for (int64_t i = 0; i < n; ++i) out[i] = v[i] * coef - sub;
}
inline void store_row(const float* v, uint16_t* out, int64_t n, float coef, float sub) {
  store_bf16(v, coef, out, n, sub);
}

// sum of v[i], i < n, in 8 fp32 lanes (then the lanes)
inline float lane_sum(const float* v, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(SCRATCHLM_AVX2) || defined(SCRATCHLM_AVX512)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(v + i));
  sum = hsum8(acc);
#endif
  for (; i < n; ++i) sum += v[i];
  return sum;
}

// loss[r] for rows r of x (rows, V); x <- dx when want_grad. y[r] the target (valid[r] false: ignored row).
template <typename T>
void cross_entropy_rows(T* x, const int64_t* y, const bool* valid, float* loss, int64_t rows, int64_t V, float eps,
                        float z, bool want_grad) {
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(V);
    for (int64_t r = r0; r < r1; ++r) {
      T* xr = x + r * V;
      if (!valid[r]) {
        loss[r] = 0.f;
        if (want_grad) std::fill(xr, xr + V, T{0});
        continue;
      }
      const float mx = widen_scale_max(xr, e.data(), V, 1.0f);  // e = x as fp32, and its max
      const float x_y = e[y[r]];
      const float sum_x = eps != 0.f ? lane_sum(e.data(), V) : 0.f;
      const float s = exp_sum(e.data(), V, mx);  // e <- exp(x - m)
      const float lse = std::log(s) + mx;
      float l = eps != 0.f ? (1.f - eps) * (lse - x_y) + eps * (lse - sum_x / static_cast<float>(V)) : lse - x_y;
      if (z != 0.f) l += z * lse * lse;
      loss[r] = l;
      if (!want_grad) continue;
      float coef = 1.f / s;
      if (z != 0.f) coef *= 1.f + 2.f * z * lse;
      const float sub = eps / static_cast<float>(V);
      store_row(e.data(), xr, V, coef, sub);
      const float dy = e[y[r]] * coef - sub - (1.f - eps);  // the target's term, from the fp32 value
      if constexpr (std::is_same_v<T, float>) xr[y[r]] = dy;
      else xr[y[r]] = bf16_rne(dy);
    }
  });
}

}  // namespace scratchlm
