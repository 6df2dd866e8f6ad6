// The rows of one weight matrix as the prompt GEMM (block_gemm.h, strassen_gemm.h) and the dequantization read
// them: the file's ggml blocks, row_bytes apart, or, where one was made, the copy repacked 16 rows at a time
// (r16_layout.h: Q4_K / Q4_0 / Q2_K / Q3_K), which is then the matrix's only storage read (kernels/ops.py drops the file's pages).
// Either way a slice widens to the same fp32 values, bit for bit (widen_block's).

#pragma once

#include <cstdint>

#include "gemm_micro.h"
#include "r16_layout.h"

namespace scratchlm {

template <typename Block>
struct WeightRows {
  const uint8_t* w;          // row 0's blocks
  int64_t row_bytes;         // bytes per row of blocks
  const uint8_t* r16;        // the repacked copy, or null
  int64_t K;                 // values per row

  // Rows [row, row + rows), columns [k0, k0 + kc), widened into out (rows x kc, ld GEMM_KC).
  void widen(int64_t row, int64_t rows, int64_t k0, int64_t kc, float* out) const {
    if constexpr (has_r16<Block>()) {
      if (r16 != nullptr) {
        for (int64_t r = 0; r < rows; ++r) r16_widen_row<Block>(r16, K, row + r, k0, kc, out + r * GEMM_KC);
        return;
      }
    }
    widen_slice<Block>(w + row * row_bytes, row_bytes, rows, k0, kc, out);
  }

  // The bytes widen(row, rows, k0, kc) reads, prefetched into L2 (the copy's 16-row groups: one stream each).
  void prefetch(int64_t row, int64_t rows, int64_t k0, int64_t kc) const {
    if constexpr (has_r16<Block>()) {
      if (r16 != nullptr) {
        const int64_t group = static_cast<int64_t>(sizeof(R16Group<Block>)), nsb = K / 256;
        for (int64_t g = row / 16; g <= (row + rows - 1) / 16; ++g)
          for (int64_t b = (g * nsb + k0 / 256) * group; b < (g * nsb + (k0 + kc) / 256) * group; b += 64)
            __builtin_prefetch(r16 + b, 0, 2);
        return;
      }
    }
    prefetch_slice<Block>(w + row * row_bytes, row_bytes, rows, k0, kc);
  }

  // Rows [n0, n1) of W as fp32 into out ((n1 - n0) x K).
  void dequantize(int64_t n0, int64_t n1, float* out) const {
    if constexpr (has_r16<Block>()) {
      if (r16 != nullptr) {
        for (int64_t n = n0; n < n1; ++n) r16_widen_row<Block>(r16, K, n, 0, K, out + (n - n0) * K);
        return;
      }
    }
    for (int64_t i = 0; i < (n1 - n0) * (K / Block::QK); ++i)
      widen_block<Block>(w + n0 * row_bytes + i * Block::BYTES, out + i * Block::QK);
  }
};

}  // namespace scratchlm
