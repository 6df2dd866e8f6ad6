// One weight matrix W (N, K) in a Format, as raw bytes, and the GEMV around it:
//   y[b, n] = (x[b] . W[n]) * out_scale[n] + bias[n] (+ residual[b, n]); optional pointers may be null.
// F32 / BF16 / F16 and every ggml block type: fp32 x against exactly the dequantized W (gemv.h; one batch row
// of Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K on AVX2, Q5_K / Q6_K on AVX-512: gemv_centered.h, the same function
// by sub-block sums; one batch row of Q2_K / Q3_K / Q4_K / Q5_K / Q6_K with AVX512-VNNI: gemv_fixed24.h, x as 24-bit
// fixed point; Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS with VBMI and BITALG too: gemv_fixed24_b32.h, the same
// rounding; Q4_K / Q4_0 / Q2_K / Q3_K from a copy repacked 16 rows at a time where one was made (r16: gemv_r16.h,
// the same x; it then replaces the blocks: past 64 rows the GEMM widens it, weight_rows.h).
// Q8_0_A8 / Q4_1_A8: x quantized to 8 bits per 32-block first, integer dot products (gemv_a8.h); `data`
// then points at the repacked weights and `aux` at their fp16 scales.
// A8_ROW + a block format: x quantized to 8 bits per block of that type, integer dot products on the ggml
// blocks in place (gemv_a8_blocks.h; past one pass of rows, with VNNI, an int8 GEMM: a8_gemm.h).
// Rows (groups of 16 rows for the A8 formats) are split over torch's intra-op threads in chunks taken as the
// threads come for them (parallel.h).

#pragma once

#include <algorithm>
#include <cstdint>

#include "a8_gemm.h"
#include "block_gemm.h"
#include "gemv.h"
#include "gemv_centered.h"
#include "gemv_fixed24.h"
#include "gemv_fixed24_avx2.h"
#include "gemv_fixed24_b32.h"
#include "gemv_fixed24_b32_avx2.h"
#include "gemv_r16.h"
#include "gemv_a8.h"
#include "gemv_a8_blocks.h"
#include "parallel.h"

namespace scratchlm {

// The codes are ops.py's FORMAT_CODES.
enum Format : int {
  F32 = 0, BF16 = 1, Q8_0 = 2, Q4_1 = 3, Q8_0_A8 = 4, Q4_1_A8 = 5, F16 = 6, Q4_0 = 7, Q5_0 = 8, Q5_1 = 9,
  IQ4_NL = 10, Q2_K = 11, Q3_K = 12, Q4_K = 13, Q5_K = 14, Q6_K = 15, IQ4_XS = 16, FORMAT_END = 17
};

constexpr int A8_ROW = 32;  // + a block format: its "A8 row" form

inline bool is_a8(int format) { return format == Q8_0_A8 || format == Q4_1_A8; }
inline bool is_dense(int format) { return format == F32 || format == BF16 || format == F16; }
inline bool is_a8_row(int format) {
  const int base = format - A8_ROW;
  return base >= 0 && base < FORMAT_END && !is_dense(base) && !is_a8(base);
}
// ggml blocks read in place with fp32 x (gemv.h, block_gemm.h): not dense, not an A8 form
inline bool is_plain_blocks(int format) { return !is_dense(format) && !is_a8(format) && !is_a8_row(format); }

// fn(Block{}) for a block format (the A8 formats: the ggml blocks they are made from); false for a dense one.
template <typename Fn>
bool visit_blocks(int format, Fn&& fn) {
  switch (is_a8_row(format) ? format - A8_ROW : format) {
    case Q8_0: case Q8_0_A8: fn(Q8_0Block{}); return true;
    case Q4_1: case Q4_1_A8: fn(Q4_1Block{}); return true;
    case Q4_0: fn(Q4_0Block{}); return true;
    case Q5_0: fn(Q5_0Block{}); return true;
    case Q5_1: fn(Q5_1Block{}); return true;
    case IQ4_NL: fn(IQ4_NLBlock{}); return true;
    case Q2_K: fn(Q2_KBlock{}); return true;
    case Q3_K: fn(Q3_KBlock{}); return true;
    case Q4_K: fn(Q4_KBlock{}); return true;
    case Q5_K: fn(Q5_KBlock{}); return true;
    case Q6_K: fn(Q6_KBlock{}); return true;
    case IQ4_XS: fn(IQ4_XSBlock{}); return true;
    default: return false;
  }
}

// Whether a part of `rows` rows of K values in `format` can have a repacked copy (r16_layout.h: Q4_K / Q4_0 / Q2_K / Q3_K where
// built, whole 16-row groups, K a multiple of 256), and the copy's bytes (0 where it cannot).
inline int64_t r16_copy_bytes(int format, int64_t rows, int64_t K) {
  int64_t bytes = 0;
  if (is_plain_blocks(format) && rows > 0 && rows % 16 == 0 && K % 256 == 0)
    visit_blocks(format, [&](auto blk) {
      if constexpr (has_r16<decltype(blk)>()) bytes = r16_bytes<decltype(blk)>(rows, K);
    });
  return bytes;
}
inline bool can_repack(int format, int64_t rows, int64_t K) { return r16_copy_bytes(format, rows, K) > 0; }

// (values per block, bytes per block) of a format; dense formats: (16, 16 values' bytes), the K they read at once.
inline void block_shape(int format, int64_t& qk, int64_t& bytes) {
  if (is_dense(format)) {
    qk = 16, bytes = format == F32 ? 64 : 32;
    return;
  }
  visit_blocks(format, [&](auto blk) { qk = decltype(blk)::QK, bytes = decltype(blk)::BYTES; });
}

// The values per activation block an A8 row format rounds x by (its block size: 32 or 256).
inline int64_t act_qk(int format) {
  int64_t qk, bytes;
  block_shape(format, qk, bytes);
  return qk;
}

// x of one call in every other form a part's route reads (each prepared once per call, for the first part that
// needs it): rounded per 32 / 256 values for the A8 row formats (and packed for a8_gemm.h), packed for block_gemm.h,
// prepared for gemv_centered*.h / gemv_fixed24.h. One per thread, kept between calls (prepared_x()): allocated per
// call, the first calls of a prompt paid in page faults; reset() marks every form stale at each call's start.
struct PreparedX {
  ActRows act32, act256;
  PackedA8 a8_32, a8_256;
  PackedX packed;
  SumsX sums;
  Fixed24X fixed, fixed8;  // fixed8: the A8 rounding of x (per 256) as gemv_fixed24.h's one-plane form
  Fixed24X fixed_more[R16_MAX_ROWS - 1];  // batch rows 1 .. 63 as `fixed` (gemv_r16.h's batches)
  Fixed24X32 fixed32;              // gemv_fixed24_b32.h's order of x (the 32-value block types)
  Fixed24X32 fixed8_32, fixed8_256;  // the same order of x's A8 rounding per 32 / 256 values (act32 / act256)

  void reset() {
    act32.qk = act256.qk = 0, a8_32.B = a8_256.B = 0, packed.B = 0, sums.K = 0;
    fixed.K = fixed8.K = fixed32.K = fixed8_32.K = fixed8_256.K = 0;
    for (auto& f : fixed_more) f.K = 0;
  }
  // batch row b of x as Fixed24X (b < R16_MAX_ROWS)
  Fixed24X& fixed_row(int64_t b) { return b == 0 ? fixed : fixed_more[b - 1]; }
  const Fixed24X& fixed_row(int64_t b) const { return b == 0 ? fixed : fixed_more[b - 1]; }
  const ActRows& act(int format) const { return act_qk(format) == 256 ? act256 : act32; }
  Fixed24X32& fixed8_b32(int format) { return act_qk(format) == 256 ? fixed8_256 : fixed8_32; }
  const Fixed24X32& fixed8_b32(int format) const { return act_qk(format) == 256 ? fixed8_256 : fixed8_32; }
  const PackedA8& a8(int format) const { return act_qk(format) == 256 ? a8_256 : a8_32; }
};

inline PreparedX& prepared_x() {
  thread_local PreparedX px;
  return px;
}

struct MatrixRef {
  int format;
  const void* data;
  int64_t N, K;
  const float* out_scale;
  const float* bias;
  const uint16_t* aux = nullptr;  // A8 formats: the fp16 scales
  int64_t ld = 0;                 // row stride of y and residual (0: N); a part of a taller matrix has more
  const uint8_t* r16 = nullptr;   // the blocks repacked 16 rows at a time (r16_layout.h), read instead of data

  int64_t ldy() const { return ld ? ld : N; }

  // Bytes of one row in the format's storage (for the A8 formats: its share of a 16-row group).
  int64_t row_bytes() const {
    int64_t qk, bytes;
    block_shape(format, qk, bytes);
    return K / qk * bytes;
  }

  // finish on y[b, n0 .. n1) in place: one loop per factor present (vectorized; none when there is none)
  void finish_row(float* y, int64_t b, int64_t n0, int64_t n1, const float* residual) const {
    float* yb = y + b * ldy();
    if (out_scale)
      for (int64_t n = n0; n < n1; ++n) yb[n] *= out_scale[n];
    if (bias)
      for (int64_t n = n0; n < n1; ++n) yb[n] += bias[n];
    if (residual) {
      const float* rb = residual + b * ldy();
      for (int64_t n = n0; n < n1; ++n) yb[n] += rb[n];
    }
  }

  float finish(float v, int64_t b, int64_t n, const float* residual) const {
    if (out_scale) v *= out_scale[n];
    if (bias) v += bias[n];
    if (residual) v += residual[b * ldy() + n];
    return v;
  }

  // B == 1, `kind` holds for this format, the switch `on` is set, the block type has the kernel (has(Block{})) and
  // there is no repacked copy (which then is the only storage read: r16_route, else gemm)
  template <typename Has>
  bool one_row_route(int64_t B, bool kind, const std::atomic<bool>& on, Has has) const {
    bool yes = false;
    if (B == 1 && kind && r16 == nullptr && on.load(std::memory_order_relaxed))
      visit_blocks(format, [&](auto blk) { yes = has(blk); });
    return yes;
  }

  // True when one batch row goes through gemv_centered.h (x prepared once per call as SumsX).
  bool centered(int64_t B) const {
    return one_row_route(B, is_plain_blocks(format), centered_enabled,
                         [](auto blk) { return has_centered<decltype(blk)>(); });
  }

  // True when the B batch rows read the repacked copy through gemv_r16.h (up to R16_MAX_ROWS; each row of x
  // prepared once per call as Fixed24X); past them the GEMM widens the copy.
  bool r16_route(int64_t B) const {
    return B <= R16_MAX_ROWS && r16 != nullptr && fixed24_enabled.load(std::memory_order_relaxed);
  }

  // True when one batch row goes through gemv_fixed24.h (x prepared once per call as Fixed24X).
  bool fixed24(int64_t B) const {
    return one_row_route(B, is_plain_blocks(format), fixed24_enabled,
                         [](auto blk) { return has_fixed24<decltype(blk)>(); });
  }

  // True when one batch row of a 32-value block type goes through gemv_fixed24_b32.h (x prepared as Fixed24X32).
  bool fixed24_b32(int64_t B) const {
    return one_row_route(B, is_plain_blocks(format), fixed24_enabled,
                         [](auto blk) { return has_fixed24_b32<decltype(blk)>(); });
  }

  // True when one batch row of an A8 row format of Q2_K / Q3_K / Q4_K / Q5_K / Q6_K goes through gemv_fixed24.h's
  // one-plane form (x rounded to Q8_K, then prepared as Fixed24X::prepare_q8).
  bool fixed8(int64_t B) const {
    return one_row_route(B, is_a8_row(format), fixed24_enabled, [](auto blk) { return has_fixed24<decltype(blk)>(); });
  }

  // True when one batch row of an A8 row format of a gemv_fixed24_b32.h type goes through its one-plane form.
  bool fixed8_b32(int64_t B) const {
    return one_row_route(B, is_a8_row(format), fixed24_enabled,
                         [](auto blk) { return has_fixed24_b32<decltype(blk)>(); });
  }

  // True when B rows of an A8 row format go through a8_gemm.h (x rounded, then packed once per call).
  bool a8_gemm(int64_t B) const { return B >= GEMM_MIN_ROWS && is_a8_row(format) && has_a8_gemm(); }

  // True when B rows of x go through block_gemm.h (x packed once per call) rather than gemv.h's passes: from
  // GEMM_MIN_ROWS rows, and for every B gemv_r16.h does not take from a repacked copy (the copy replaces the
  // blocks: gemv.h's passes read them in place).
  bool gemm(int64_t B) const {
    return is_plain_blocks(format) && (B >= GEMM_MIN_ROWS || (r16 != nullptr && !r16_route(B)));
  }

  // The rows as block_gemm.h and dequantize read them: the file's blocks, or the repacked copy where there is one.
  template <typename Block>
  WeightRows<Block> weight_rows() const {
    return {static_cast<const uint8_t*>(data), row_bytes(), r16, K};
  }

  // x's forms this matrix reads at B rows into px (those not there yet).
  void prepare(const float* x, int64_t B, PreparedX& px) const {
    if (gemm(B) && px.packed.B == 0) px.packed.pack(x, B, K);
    if (r16_route(B)) {
      for (int64_t b = 0; b < B; ++b)
        if (px.fixed_row(b).K == 0) px.fixed_row(b).prepare(x + b * K, K);
    } else if (fixed24_b32(B)) {
      if (px.fixed32.K == 0) px.fixed32.prepare(x, K);
    } else if (fixed24(B)) {
      if (px.fixed.K == 0) px.fixed.prepare(x, K);
    } else if (centered(B) && px.sums.K == 0) {
      px.sums.prepare(x, K);
    }
    if (!is_a8_row(format)) return;
    ActRows& a = act_qk(format) == 256 ? px.act256 : px.act32;
    if (a.qk == 0) quantize_act_rows(x, B, K, act_qk(format), a);
    PackedA8& pk = a.qk == 256 ? px.a8_256 : px.a8_32;
    if (a8_gemm(B) && pk.B == 0) pk.pack(a);
    if (fixed8(B) && px.fixed8.K == 0) px.fixed8.prepare_q8(a);
    if (fixed8_b32(B) && px.fixed8_b32(format).K == 0) px.fixed8_b32(format).prepare_q8(a);
  }

  // y (B, ldy) row-major; x (B, K) row-major fp32; residual (B, ldy) or null (may alias y).
  void matvec(const float* x, float* y, int64_t B, const float* residual) const {
    if (is_a8(format)) return matvec_a8(x, y, B, residual);
    PreparedX& px = prepared_x();
    px.reset();
    prepare(x, B, px);
    parallel_chunks(N, row_chunk(N, row_bytes() * B),  // chunks by work: B tokens per row read
                    [&](int64_t n0, int64_t n1) { range(x, y, B, residual, n0, n1, px); });
  }

  // Rows [n0, n1) of y on this thread (not the interleaved A8 formats); px: x's other forms (prepare), read by
  // gemv_fixed24_b32.h / gemv_fixed24.h (fixed24_b32(B) / fixed24(B), first), gemv_centered*.h (centered(B)),
  // a8_gemm.h (a8_gemm(B)), block_gemm.h (gemm(B)) and the A8 row kernels.
  void range(const float* x, float* y, int64_t B, const float* residual, int64_t n0, int64_t n1,
             const PreparedX& px) const {
    const Fixed24X* fixed = &px.fixed;
    const SumsX* sums = &px.sums;
    const PackedA8* a8 = &px.a8(format);
    const PackedX* packed = &px.packed;
    const ActRows* act = &px.act(format);
    const int64_t L = ldy();
    const auto* bytes = static_cast<const uint8_t*>(data);
    const Fixed24X* one_row = fixed24(B) ? fixed : (fixed8(B) ? &px.fixed8 : nullptr);
    auto fin = [&](int64_t b, int64_t lo, int64_t hi) { finish_row(y, b, lo, hi, residual); };  // the GEMMs' rows
    if (r16_route(B) && px.fixed_row(B - 1).K == K) {  // the repacked copy, x prepared by the caller
      const Fixed24X* xs[R16_MAX_ROWS];
      for (int64_t b = 0; b < B; ++b) xs[b] = &px.fixed_row(b);
      visit_blocks(format, [&](auto blk) {
        if constexpr (has_r16<decltype(blk)>()) r16_rows<decltype(blk)>(xs, B, r16, y, L, n0, n1);
      });
      for (int64_t b = 0; b < B; ++b) finish_row(y, b, n0, n1, residual);
      return;
    }
    const Fixed24X32* one_row32 = fixed24_b32(B) ? &px.fixed32 : (fixed8_b32(B) ? &px.fixed8_b32(format) : nullptr);
    if (B == 1 && one_row32 != nullptr && one_row32->K == K) {  // prepared by the caller: the switch may move
      visit_blocks(format, [&](auto blk) {
        if constexpr (has_fixed24_b32<decltype(blk)>()) fixed24_b32_rows<decltype(blk)>(*one_row32, bytes, y, n0, n1);
      });
      finish_row(y, 0, n0, n1, residual);
      return;
    }
    if (B == 1 && one_row != nullptr && one_row->K == K) {  // prepared by the caller: the switch may move
      visit_blocks(format, [&](auto blk) {
        if constexpr (has_fixed24<decltype(blk)>()) fixed24_rows<decltype(blk)>(*one_row, bytes, y, n0, n1);
      });
      finish_row(y, 0, n0, n1, residual);
      return;
    }
    if (B == 1 && sums != nullptr && sums->K == K && centered(B)) {  // prepared by the caller: the switch may move
      visit_blocks(format, [&](auto blk) {
        if constexpr (has_centered<decltype(blk)>()) centered_rows<decltype(blk)>(*sums, bytes, y, n0, n1);
      });
      finish_row(y, 0, n0, n1, residual);
      return;
    }
#if defined(SCRATCHLM_VNNI)
    if (a8_gemm(B) && a8 != nullptr && a8->B == B) {
      visit_blocks(format, [&](auto blk) { a8_gemm_rows<decltype(blk)>(*a8, bytes, y, L, n0, n1, fin); });
      return;
    }
#endif
    if (gemm(B) && packed->B == B) {  // prepared by the caller (else gemv.h's passes on the blocks: the same values)
      visit_blocks(format, [&](auto blk) {
        using Block = decltype(blk);
        gemm_block_rows<Block>(*packed, weight_rows<Block>(), y, L, n0, n1, fin);
      });
      return;
    }
    const int64_t tile = is_plain_blocks(format) ? BLOCK_BATCH_TILE : BATCH_TILE;  // batch rows per weight pass
    for (int64_t b0 = 0; b0 < B; b0 += tile) {
      const int64_t nb = std::min(tile, B - b0);
      if (is_a8_row(format)) {
        visit_blocks(format, [&](auto blk) { a8b_rows<decltype(blk)>(*act, bytes, y, L, b0, nb, n0, n1); });
      } else {
        rows(x, y, b0, nb, n0, n1);
      }
      for (int64_t b = b0; b < b0 + nb; ++b)
        finish_row(y, b, n0, n1, residual);
    }
  }

  void matvec_a8(const float* x, float* y, int64_t B, const float* residual) const {
    ActQ8 a;
    quantize_rows(x, B, K, a);
    const bool q4 = format == Q4_1_A8;
    const auto* w = static_cast<const uint8_t*>(data);
    const int64_t groups = (N + GROUP - 1) / GROUP, L = ldy();
    parallel_chunks(groups, row_chunk(groups, GROUP * row_bytes()), [&](int64_t g0, int64_t g1) {
      float out[BATCH_TILE][GROUP];
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t rows = std::min(GROUP, N - g * GROUP);
        for (int64_t b0 = 0; b0 < B; b0 += BATCH_TILE) {
          const int64_t nb = std::min(BATCH_TILE, B - b0);
          q4 ? a8_rows<true>(w, aux, a, b0, nb, g, out) : a8_rows<false>(w, aux, a, b0, nb, g, out);
          for (int64_t b = 0; b < nb; ++b)
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t n = g * GROUP + r;
              y[(b0 + b) * L + n] = finish(out[b][r], b0 + b, n, residual);
            }
        }
      }
    });
  }

  void rows(const float* x, float* y, int64_t b0, int64_t nb, int64_t n0, int64_t n1) const {
    const auto* bytes = static_cast<const uint8_t*>(data);
    const int64_t L = ldy();
    switch (format) {
      case F32: return dense_rows<F32Dense>(x, bytes, y, K, L, b0, nb, n0, n1);
      case BF16: return dense_rows<BF16Dense>(x, bytes, y, K, L, b0, nb, n0, n1);
      case F16: return dense_rows<F16Dense>(x, bytes, y, K, L, b0, nb, n0, n1);
      default:
        visit_blocks(format, [&](auto blk) { block_rows<decltype(blk)>(x, bytes, y, K, L, b0, nb, n0, n1); });
    }
  }

  // W's fp32 values (N, K) through the kernels' widening (block formats only; from the repacked copy where there is
  // one), rows split over the threads.
  void dequantize(float* out) const {
    parallel_chunks(N, row_chunk(N, row_bytes()), [&](int64_t n0, int64_t n1) {
      visit_blocks(format, [&](auto blk) { weight_rows<decltype(blk)>().dequantize(n0, n1, out + n0 * K); });
    });
  }
};

}  // namespace scratchlm
