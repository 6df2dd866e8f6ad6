// The copies of Q4_K, Q4_0, Q2_K and Q3_K matrices repacked 16 rows at a time (lanes = rows) that gemv_r16.h reads
// for up to 64 batch rows, and their widening back to the blocks' fp32 values for the prompt GEMM and dequantize
// (weight_rows.h). The copy is made once per matrix (repack_r16, kernels/ops.py's `repacked`) and then replaces the
// blocks: ops.py drops the file's pages under the matrix and every route reads the copy.
//
// Per 16 rows and 256 values (one super-block of each row; groups laid out group by group, each group's
// super-blocks in order: one stream per group):
//   Q4_K (R16Q4K, 2368 bytes for 16 x 144): d[16], dmin[16] fp16; sc[8][16], m[8][16] the 6-bit scale and min of
//        sub-block s of row r, one byte each; qs[32][64]
//   Q4_0 (R16Q40, 2304 bytes: 16 x 8 blocks of 18): d[8][16] fp16 of block s of row r; qs[32][64]
//        qs[t]: values 8t .. 8t + 7, byte 4r + i holding value 8t + i of row r (low nibble) and 8t + 4 + i (high)
//   Q2_K (R16Q2K, 1344 bytes for 16 x 84): d[16], dmin[16] fp16; sc[16][16] the byte (scale | min << 4) of
//        16-value group j of row r; q[8][2][64]: per 32 values s, byte 4r + i of q[s][0] holds in bits 2u, 2u + 1
//        the 2-bit q of value 8t + i of row r (t = 4s + u), q[s][1] those of value 8t + 4 + i
//   Q3_K (R16Q3K, 1824 bytes for 16 x 110): d[16] fp16; sc[16][16] the scale - 32 (int8) of group j of row r;
//        q[8][3][64]: q[s][0], q[s][1] the low 2 bits as Q2_K's, q[s][2] byte 4r + i: bit u the third bit of value
//        8t + i, bit 4 + u that of value 8t + 4 + i (q = 0 .. 7, w = d sc (q - 4): ggml's q + 4)
// (A Q6_K copy of this form, its high-bit planes beside the lines, ran 0.85-0.91x the in-place gemv_fixed24.h in
// the 1B Q6_K decode: one stream per 16-row group drew less DRAM bandwidth than that kernel's four rows' streams,
// with or without software prefetch; benchmarks/RESULTS.md.)

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gemv_fixed24.h"

namespace scratchlm {

struct R16Q4K {
  uint16_t d[16], dmin[16];
  uint8_t sc[8][16], m[8][16];
  uint8_t qs[32][64];
};
static_assert(sizeof(R16Q4K) == 2368, "R16Q4K is 16 rows x one Q4_K super-block");
struct R16Q40 {
  uint16_t d[8][16];
  uint8_t qs[32][64];
};
static_assert(sizeof(R16Q40) == 2304, "R16Q40 is 16 rows x 8 Q4_0 blocks");
struct R16Q2K {
  uint16_t d[16], dmin[16];
  uint8_t sc[16][16];
  uint8_t q[8][2][64];
};
static_assert(sizeof(R16Q2K) == 1344, "R16Q2K is 16 rows x one Q2_K super-block");
struct R16Q3K {
  uint16_t d[16];
  int8_t sc[16][16];
  uint8_t q[8][3][64];
};
static_assert(sizeof(R16Q3K) == 1824, "R16Q3K is 16 rows x one Q3_K super-block");

// The block types with a repacked copy (where built with gemv_fixed24.h), and their layout per 16 rows x 256 values.
template <typename Block>
constexpr bool has_r16() {
#if defined(SCRATCHLM_FIXED24)  // gemv_r16.h is AVX512-VNNI's (not gemv_fixed24_avx2.h's targets)
  return std::is_same_v<Block, Q4_KBlock> || std::is_same_v<Block, Q4_0Block> || std::is_same_v<Block, Q2_KBlock> ||
         std::is_same_v<Block, Q3_KBlock>;
#else
  return false;
#endif
}
// The 2-bit-plane types: scales per 16 values, q in bit planes (the 4-bit ones: per 32 values, q in nibbles)
template <typename Block>
constexpr bool r16_planes() {
  return std::is_same_v<Block, Q2_KBlock> || std::is_same_v<Block, Q3_KBlock>;
}
template <typename Block>
using R16Group = std::conditional_t<
    std::is_same_v<Block, Q4_KBlock>, R16Q4K,
    std::conditional_t<std::is_same_v<Block, Q2_KBlock>, R16Q2K,
                       std::conditional_t<std::is_same_v<Block, Q3_KBlock>, R16Q3K, R16Q40>>>;

// Bytes of the copy of `rows` rows (a multiple of 16) of K values (a multiple of 256).
template <typename Block>
inline int64_t r16_bytes(int64_t rows, int64_t K) {
  return rows / 16 * (K / 256) * static_cast<int64_t>(sizeof(R16Group<Block>));
}

// The 256 quants q of a row's super-block i (blocks.h's `quants`, unsigned, in value order) into q: one K-quant
// block, or eight Q4_0 blocks.
template <typename Block>
inline void super_block_quants(const uint8_t* row, int64_t i, uint8_t* q) {
  for (int c = 0; c < 8; ++c) {
    const bool k = Block::QK == 256;
    B16 lo, hi;
    Block::quants(row + (k ? i : 8 * i + c) * Block::BYTES, k ? c : 0, lo, hi);
    store_b16(q + 32 * c, lo), store_b16(q + 32 * c + 16, hi);
  }
}

// Row r's super-block i (at row) into group o: its scales, and its quants q (super_block_quants) in the layout's
// lines (nibbles) or bit planes.
template <typename Block>
inline void repack_super_block(const uint8_t* row, int64_t i, int r, R16Group<Block>* o) {
  alignas(16) uint8_t q[256];
  super_block_quants<Block>(row, i, q);
  const uint8_t* b = row + i * Block::BYTES;  // the K-quants' block
  if constexpr (std::is_same_v<Block, Q3_KBlock>) {  // [hmask 32][qs 64][scales 12][d]
    uint8_t six[16];
    q3k_scales(b + 96, six);
    for (int j = 0; j < 16; ++j) o->sc[j][r] = static_cast<int8_t>(six[j] - 32);
    std::memcpy(&o->d[r], b + 108, 2);
  } else if constexpr (std::is_same_v<Block, Q2_KBlock>) {  // [scales 16][qs 64][d][dmin]
    for (int j = 0; j < 16; ++j) o->sc[j][r] = b[j];
    std::memcpy(&o->d[r], b + 80, 2), std::memcpy(&o->dmin[r], b + 82, 2);
  } else if constexpr (std::is_same_v<Block, Q4_KBlock>) {  // [d][dmin][scales 12][qs 128]
    uint32_t u[4];  // the 8 six-bit scales, then the 8 mins
    k4_unpack(b, u);
    const auto* six = reinterpret_cast<const uint8_t*>(u);
    for (int s = 0; s < 8; ++s) o->sc[s][r] = six[s], o->m[s][r] = six[8 + s];
    std::memcpy(&o->d[r], b, 2), std::memcpy(&o->dmin[r], b + 2, 2);
  } else {  // Q4_0: [d][qs 16] per 32 values
    for (int s = 0; s < 8; ++s) std::memcpy(&o->d[s][r], row + (8 * i + s) * Q4_0Block::BYTES, 2);
  }
  for (int s = 0; s < 8; ++s)
    for (int k = 0; k < 4; ++k) {  // byte 4 r + k of line t = 4 s + u: values 8 t + k, 8 t + 4 + k
      uint8_t p0 = 0, p1 = 0, p2 = 0;
      for (int u = 0; u < 4; ++u) {
        const uint8_t a = q[32 * s + 8 * u + k], c = q[32 * s + 8 * u + 4 + k];
        if constexpr (r16_planes<Block>()) {
          p0 = static_cast<uint8_t>(p0 | (a & 3) << (2 * u)), p1 = static_cast<uint8_t>(p1 | (c & 3) << (2 * u));
          p2 = static_cast<uint8_t>(p2 | (a >> 2) << u | (c >> 2) << (4 + u));
        } else {
          o->qs[4 * s + u][4 * r + k] = static_cast<uint8_t>(a | c << 4);
        }
      }
      if constexpr (r16_planes<Block>()) {
        o->q[s][0][4 * r + k] = p0, o->q[s][1][4 * r + k] = p1;
        if constexpr (std::is_same_v<Block, Q3_KBlock>) o->q[s][2][4 * r + k] = p2;
      }
    }
}

// w: rows x K values in Block (has_r16; rows a multiple of 16, K of 256) -> out: r16_bytes<Block>(rows, K) bytes
// (layout above).
template <typename Block>
inline void repack_r16(const uint8_t* w, int64_t rows, int64_t K, uint8_t* out) {
  const int64_t nsb = K / 256, row_bytes = K / Block::QK * Block::BYTES;
  at::parallel_for(0, rows / 16, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t i = 0; i < nsb; ++i)
        for (int r = 0; r < 16; ++r)
          repack_super_block<Block>(w + (16 * g + r) * row_bytes, i, r,
                                    reinterpret_cast<R16Group<Block>*>(out) + g * nsb + i);
  });
}

#if defined(SCRATCHLM_FIXED24)
// Row r of a Q2_K / Q3_K group's super-block b widened into out (256 values): w = fma(q, s, t) per 16-value group,
// s = d sc, t = -(dmin m) (Q2_K) or s = d (sc - 32), t = -4 s (Q3_K), as blocks.h's prepare computes them.
template <typename Block>
inline void r16_widen_planes(const R16Group<Block>& b, int r, float* out) {
  constexpr bool k3 = std::is_same_v<Block, Q3_KBlock>;
  const float d = fp16_to_f32(reinterpret_cast<const uint8_t*>(&b.d[r]));
  float dmin = 0.0f;
  if constexpr (!k3) dmin = fp16_to_f32(reinterpret_cast<const uint8_t*>(&b.dmin[r]));
  const __m128i two = _mm_setr_epi32(0, 2, 4, 6), three = _mm_set1_epi8(3), one = _mm_set1_epi8(1);
  for (int s = 0; s < 8; ++s) {
    // the row's bytes of each plane in every dword, shifted so that dword u holds field u (values 8 u + i)
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(b.q[s][0] + 4 * r))), two), three);
    __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(b.q[s][1] + 4 * r))), two), three);
    if constexpr (k3) {
      const __m128i top = _mm_set1_epi32(static_cast<int>(load_u32(b.q[s][2] + 4 * r)));
      lo = _mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(_mm_srlv_epi32(top, _mm_setr_epi32(0, 1, 2, 3)), one), 2));
      hi = _mm_or_si128(hi, _mm_slli_epi16(_mm_and_si128(_mm_srlv_epi32(top, _mm_setr_epi32(4, 5, 6, 7)), one), 2));
    }
    for (int h = 0; h < 2; ++h) {  // values 32 s + 16 h .. + 15: group 2 s + h
      float sv, tv;
      if constexpr (k3) {
        sv = static_cast<float>(b.sc[2 * s + h][r]) * d, tv = sv * -4.0f;
      } else {
        const uint8_t v = b.sc[2 * s + h][r];
        sv = static_cast<float>(v & 15) * d, tv = static_cast<float>(v >> 4) * -dmin;
      }
      const __m128i q = h ? _mm_unpackhi_epi32(lo, hi) : _mm_unpacklo_epi32(lo, hi);
      _mm512_storeu_ps(out + 32 * s + 16 * h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)),
                                                               _mm512_set1_ps(sv), _mm512_set1_ps(tv)));
    }
  }
}

// Row r of a Q4_K / Q4_0 group's super-block b widened into out (256 values): w = fma(q, s, t) with s = d sc,
// t = -(dmin m) for Q4_K, s = d, t = -8 d for Q4_0. Per 32 values: the row's 4 bytes of each of 4 lines of qs
// (values 8 u .. 8 u + 3 in the low nibbles of line u's bytes, 8 u + 4 .. 8 u + 7 in the high).
template <typename Block>
inline void r16_widen_nibbles(const R16Group<Block>& b, int r, float* out) {
  constexpr bool k4 = std::is_same_v<Block, Q4_KBlock>;
  const __m128i nib = _mm_set1_epi8(0x0f);
  float d = 0.0f, dmin = 0.0f;
  if constexpr (k4) d = fp16_to_f32(reinterpret_cast<const uint8_t*>(&b.d[r])),
                    dmin = fp16_to_f32(reinterpret_cast<const uint8_t*>(&b.dmin[r]));
  for (int s = 0; s < 8; ++s) {
    float sv, tv;
    if constexpr (k4) {
      sv = static_cast<float>(b.sc[s][r]) * d, tv = static_cast<float>(b.m[s][r]) * -dmin;
    } else {
      sv = fp16_to_f32(reinterpret_cast<const uint8_t*>(&b.d[s][r])), tv = -8.0f * sv;
    }
    const __m128i q = _mm_set_epi32(static_cast<int>(load_u32(b.qs[4 * s + 3] + 4 * r)),
                                    static_cast<int>(load_u32(b.qs[4 * s + 2] + 4 * r)),
                                    static_cast<int>(load_u32(b.qs[4 * s + 1] + 4 * r)),
                                    static_cast<int>(load_u32(b.qs[4 * s] + 4 * r)));
    const __m128i lo = _mm_and_si128(q, nib), hi = _mm_and_si128(_mm_srli_epi16(q, 4), nib);
    const __m512 sc = _mm512_set1_ps(sv), t = _mm512_set1_ps(tv);
    _mm512_storeu_ps(out + 32 * s, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi32(lo, hi))), sc, t));
    _mm512_storeu_ps(out + 32 * s + 16,
                     _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi32(lo, hi))), sc, t));
  }
}

// Row `row` of the copy w (K values per row), values [k0, k0 + kc) (multiples of 256), widened into out: the values
// widen_block<Block> makes of the file's blocks, bit for bit (each product exact, one rounding in the fma).
template <typename Block>
inline void r16_widen_row(const uint8_t* w, int64_t K, int64_t row, int64_t k0, int64_t kc, float* out) {
  const int64_t nsb = K / 256;
  const int r = static_cast<int>(row % 16);
  for (int64_t i = k0 / 256; i < (k0 + kc) / 256; ++i, out += 256) {
    const auto& b = reinterpret_cast<const R16Group<Block>*>(w)[row / 16 * nsb + i];
    if constexpr (r16_planes<Block>())
      r16_widen_planes<Block>(b, r, out);
    else
      r16_widen_nibbles<Block>(b, r, out);
  }
}

#else
template <typename Block>
inline void r16_widen_row(const uint8_t*, int64_t, int64_t, int64_t, int64_t, float*) {}
#endif

}  // namespace scratchlm
