// RMSNorm for training (nn/fused_rms_norm.py), one pass over each row each way:
//
//   forward    r_i = 1 / sqrt(mean_j x_ij^2 + eps)        y_ij = x_ij r_i g_j          (y fp32 or bf16)
//   backward   u_ij = dy_ij g_j     dx_ij = r_i (u_ij - x_ij r_i^2 mean_j(u_ij x_ij))     (dy fp32 or bf16)
//              dg_j = sum_i dy_ij x_ij r_i
//
// x (rows, D) fp32, g (D,) fp32; y rounds once to bf16 (nearest even, as torch's .to(torch.bfloat16)) when it is
// bf16: what a bf16 autocast Linear would make of the fp32 norm output. The row sums are simd.h's dot_product. dg
// is summed over NORM_PARTS fixed row ranges, then those partials in order: the same bits for any number of threads
// (the trainers' resume guarantee). torch's eager F.rms_norm and its autograd take about ten passes over (rows, D)
// plus a cast per consumer; under bf16 autocast those casts and their gradients cost as much as the norm itself
// (benchmarks/RESULTS.md, issue #26).

#pragma once

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "causal_softmax.h"
#include "simd.h"

namespace scratchlm {

constexpr int64_t NORM_PARTS = 16;

inline void store_value(float* out, int64_t j, float v) { out[j] = v; }
inline void store_value(uint16_t* out, int64_t j, float v) { out[j] = bf16_rne(v); }

template <typename Out>
void rms_norm_rows(const float* x, const float* g, float eps, Out* y, float* rstd, int64_t rows, int64_t D) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * D;
      const float rs = 1.f / std::sqrt(dot_product(xr, xr, D) / static_cast<float>(D) + eps);
      rstd[r] = rs;
      Out* yr = y + r * D;
      for (int64_t j = 0; j < D; ++j) store_value(yr, j, xr[j] * rs * g[j]);
    }
  });
}

template <typename G>
void rms_norm_rows_grad(const float* x, const float* g, const float* rstd, const G* dy, float* dx, float* dg,
                        int64_t rows, int64_t D) {
  const int64_t parts = std::min<int64_t>(NORM_PARTS, rows);
  std::vector<float> partial(static_cast<size_t>(parts * D), 0.f);
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> u(static_cast<size_t>(D));
    for (int64_t p = p0; p < p1; ++p) {
      float* dgp = partial.data() + p * D;
      for (int64_t r = p * rows / parts; r < (p + 1) * rows / parts; ++r) {
        const float* xr = x + r * D;
        const G* dyr = dy + r * D;
        const float rs = rstd[r];
        for (int64_t j = 0; j < D; ++j) {
          const float d = load_f32(dyr, j);
          u[j] = d * g[j];
          dgp[j] += d * (xr[j] * rs);
        }
        const float c = rs * rs * dot_product(u.data(), xr, D) / static_cast<float>(D);
        float* dxr = dx + r * D;
        for (int64_t j = 0; j < D; ++j) dxr[j] = rs * (u[j] - xr[j] * c);
      }
    }
  });
  for (int64_t j = 0; j < D; ++j) dg[j] = 0.f;
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t j = 0; j < D; ++j) dg[j] += partial[p * D + j];
}

}  // namespace scratchlm
