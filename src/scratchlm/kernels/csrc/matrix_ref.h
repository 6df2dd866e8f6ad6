// One weight matrix W (N, K) in a Format, as raw bytes, and the GEMV around it:
//   y[b, n] = (x[b] . W[n]) * out_scale[n] + bias[n] (+ residual[b, n]); optional pointers may be null.
// F32 / BF16 / Q8_0 / Q4_1: fp32 x against exactly the dequantized W (gemv.h).
// Q8_0_A8 / Q4_1_A8: x quantized to 8 bits per 32-block first, integer dot products (gemv_a8.h); `data`
// then points at the repacked weights and `aux` at their fp16 scales.
// Rows (groups of 16 rows for the A8 formats) are split over torch's intra-op threads (at::parallel_for).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "gemv.h"
#include "gemv_a8.h"

namespace scratchlm {

// Rows per task: enough work to amortise waking a thread (~64 KB of weights), so a 2-thread split
// only happens on matrices where it pays.
inline int64_t grain(int64_t row_bytes) { return std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(row_bytes, 1)); }

enum Format : int { F32 = 0, BF16 = 1, Q8_0 = 2, Q4_1 = 3, Q8_0_A8 = 4, Q4_1_A8 = 5 };

inline bool is_a8(int format) { return format == Q8_0_A8 || format == Q4_1_A8; }

struct MatrixRef {
  int format;
  const void* data;
  int64_t N, K;
  const float* out_scale;
  const float* bias;
  const uint16_t* aux = nullptr;  // A8 formats: the fp16 scales

  // Bytes of one row in the format's storage (for the A8 formats: its share of a 16-row group).
  int64_t row_bytes() const {
    switch (format) {
      case F32: return K * 4;
      case BF16: return K * 2;
      case Q8_0: case Q8_0_A8: return (K / QK) * Q8_0_BYTES;
      default: return (K / QK) * Q4_1_BYTES;
    }
  }

  float finish(float v, int64_t b, int64_t n, const float* residual) const {
    if (out_scale) v *= out_scale[n];
    if (bias) v += bias[n];
    if (residual) v += residual[b * N + n];
    return v;
  }

  // y (B, N) row-major; x (B, K) row-major fp32; residual (B, N) or null (may alias y).
  void matvec(const float* x, float* y, int64_t B, const float* residual) const {
    if (is_a8(format)) return matvec_a8(x, y, B, residual);
    at::parallel_for(0, N, grain(row_bytes()), [&](int64_t n0, int64_t n1) {
      for (int64_t b0 = 0; b0 < B; b0 += BATCH_TILE) {
        const int64_t nb = std::min(BATCH_TILE, B - b0);
        rows(x, y, b0, nb, n0, n1);
        for (int64_t b = b0; b < b0 + nb; ++b)
          for (int64_t n = n0; n < n1; ++n) y[b * N + n] = finish(y[b * N + n], b, n, residual);
      }
    });
  }

  void matvec_a8(const float* x, float* y, int64_t B, const float* residual) const {
    ActQ8 a;
    quantize_rows(x, B, K, a);
    const bool q4 = format == Q4_1_A8;
    const auto* w = static_cast<const uint8_t*>(data);
    const int64_t groups = (N + GROUP - 1) / GROUP;
    at::parallel_for(0, groups, grain(GROUP * row_bytes()), [&](int64_t g0, int64_t g1) {
      float out[BATCH_TILE][GROUP];
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t rows = std::min(GROUP, N - g * GROUP);
        for (int64_t b0 = 0; b0 < B; b0 += BATCH_TILE) {
          const int64_t nb = std::min(BATCH_TILE, B - b0);
          q4 ? a8_rows<true>(w, aux, a, b0, nb, g, out) : a8_rows<false>(w, aux, a, b0, nb, g, out);
          for (int64_t b = 0; b < nb; ++b)
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t n = g * GROUP + r;
              y[(b0 + b) * N + n] = finish(out[b][r], b0 + b, n, residual);
            }
        }
      }
    });
  }

  void rows(const float* x, float* y, int64_t b0, int64_t nb, int64_t n0, int64_t n1) const {
    const auto* bytes = static_cast<const uint8_t*>(data);
    switch (format) {
      case F32: dense_rows<float>(x, static_cast<const float*>(data), y, K, N, b0, nb, n0, n1); break;
      case BF16: dense_rows<uint16_t>(x, static_cast<const uint16_t*>(data), y, K, N, b0, nb, n0, n1); break;
      case Q8_0: block_rows<Q8_0Block>(x, bytes, y, K, N, b0, nb, n0, n1); break;
      default: block_rows<Q4_1Block>(x, bytes, y, K, N, b0, nb, n0, n1); break;
    }
  }
};

}  // namespace scratchlm
