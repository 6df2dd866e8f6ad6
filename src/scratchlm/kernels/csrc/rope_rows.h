// RoPE for training (nn/rope.py's fused form, eager), one pass each way over the head rows of q or k:
//
//   forward    y = x cos + rot(x) sin        rot(a, b) = (-b, a) on each pair of the style
//   backward   dx = dy cos - rot(dy) sin     (rot is a rotation by 90 degrees: its transpose is -rot)
//
// pairs: "half" (x[i], x[i + Hd/2]) or "interleaved" (x[2i], x[2i + 1]); cos / sin the full-width tables of the
// style (cos[i] = cos[partner(i)]), fp32, one row per position: shared by the batch (cos_sb 0) or per batch row.
// x, y (B, H, T, Hd) fp32 or bf16 (one dtype) with any strides but a contiguous last dim: the forward reads the
// projection's (B, T, H, Hd) layout through its transposed view and writes (B, H, T, Hd) contiguous (what the
// attention reads); the backward writes dx in the projection's layout, so neither direction copies for a
// transpose. Math in fp32, one rounding to the dtype (bf16: nearest even, as torch's .to(torch.bfloat16)).
// torch's eager fused form took five passes (widen, two products, the rotation's negate and concatenation,
// narrow) plus a copy for the layout.

#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#include "causal_softmax.h"

namespace scratchlm {

constexpr int64_t ROPE_MAX_HD = 1024;

struct RowStrides {
  int64_t b, h, t;
};

template <typename T>
void rope_rows(const T* x, RowStrides xs, T* y, RowStrides ys, const float* cos, const float* sin, int64_t cos_sb,
               int64_t B, int64_t H, int64_t Tn, int64_t Hd, bool half, float sign) {
  at::parallel_for(0, B * H * Tn, 64, [&](int64_t r0, int64_t r1) {
    alignas(64) float v[ROPE_MAX_HD], rot[ROPE_MAX_HD];
    const int64_t h2 = Hd / 2;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (H * Tn), h = (r / Tn) % H, t = r % Tn;
      widen_tile(x + b * xs.b + h * xs.h + t * xs.t, v, Hd);
      if (half) {
        for (int64_t i = 0; i < h2; ++i) rot[i] = -v[i + h2];
        for (int64_t i = h2; i < Hd; ++i) rot[i] = v[i - h2];
      } else {
        for (int64_t i = 0; i < Hd; i += 2) {
          rot[i] = -v[i + 1];
          rot[i + 1] = v[i];
        }
      }
      const float* c = cos + b * cos_sb + t * Hd;
      const float* s = sin + b * cos_sb + t * Hd;
      for (int64_t i = 0; i < Hd; ++i) v[i] = v[i] * c[i] + sign * (rot[i] * s[i]);
      store_tile(v, y + b * ys.b + h * ys.h + t * ys.t, Hd);
    }
  });
}

}  // namespace scratchlm
