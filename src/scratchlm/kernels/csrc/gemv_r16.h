// Q4_K and Q4_0 matrices from a copy of their blocks repacked 16 rows at a time, lanes = rows (AVX512-VNNI): up to
// 64 batch rows with x as gemv_fixed24.h's 24-bit fixed point, its digits broadcast, every product and 16-value sum
// exact in integers; past that, and for dequantize, the copy widened to the blocks' fp32 values (r16_widen_row:
// block_gemm.h's GEMM through weight_rows.h).
//
// gemv_fixed24.h reads the file's blocks in place: a register holds 64 values of one row, so each 64 weights
// also cost a permute of the scales, a conversion and an FMA, and two shifts join the three digit planes (~9
// vector ops per 64 weights). Here a register holds 4 values of each of 16 rows (int32 lane r = row r), so x's 4
// digits of those values are one broadcast operand of vpdpbusd, the three planes accumulate apart for 16 values
// of x and are joined once (two shifts, two adds), and the scales are a vector per 32 values (~5.5 ops per 64):
//   P_r = sum over 16 values v of q_rv X_v = 65536 sum q a2 + 256 sum q a1 + sum q a0   (exact in int32:
//         16 * 15 * (2^23 - 2^16) < 2^31; the planes' sums are taken mod 2^32 and the total fits)
//   y_r = sum over 32-value blocks s ( s_rs 2^-k_s * sum of its two P_r  +  t_rs * sum_s x~ )
// with w = s q + t: Q4_K s = d sc, t = -dmin m; Q4_0 s = d, t = -8 d (all exact in fp32): the same terms as
// gemv_fixed24.h's (x~ = X 2^-k, per 32 values, so K must be a multiple of 256 for both types), another fp32 order.
// In cache one Zen 4 core runs 25-26 GB/s of Q4_K against gemv_fixed24.h's 17. Made by default where built
// (kernels/ops.py's `repacked`; SCRATCHLM_REPACK=0: none).
//
// The copy is made once per matrix (repack_r16) and then replaces the blocks: ops.py drops the file's pages under
// the matrix and every route reads the copy. (A Q6_K copy in the same form, its qh planes beside the lines, ran
// 0.85-0.91x the in-place gemv_fixed24.h in the 1B Q6_K decode: one stream per 16-row group draws less DRAM
// bandwidth than that kernel's 4 rows' streams, with or without software prefetch; RESULTS.md.) Per 16 rows and
// 256 values:
//   Q4_K (R16Q4K, 2368 bytes for 16 x 144): d[16], dmin[16] fp16; sc[8][16], m[8][16] the 6-bit scale and min of
//        sub-block s of row r, one byte each; qs[32][64]
//   Q4_0 (R16Q40, 2304 bytes: 16 x 8 blocks of 18): d[8][16] fp16 of block s of row r; qs[32][64]
//   qs[t]: values 8t .. 8t + 7, byte 4r + i holding value 8t + i of row r (low nibble) and 8t + 4 + i (high).
// Groups are laid out group by group, each group's super-blocks in order: one stream per group.

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

// The block types with a repacked copy (where built with gemv_fixed24.h), and their layout per 16 rows x 256 values.
template <typename Block>
constexpr bool has_r16() {
  return has_fixed24<Q4_KBlock>() && (std::is_same_v<Block, Q4_KBlock> || std::is_same_v<Block, Q4_0Block>);
}
template <typename Block>
using R16Group = std::conditional_t<std::is_same_v<Block, Q4_KBlock>, R16Q4K, R16Q40>;

// Bytes of the copy of `rows` rows (a multiple of 16) of K values (a multiple of 256).
template <typename Block>
inline int64_t r16_bytes(int64_t rows, int64_t K) {
  return rows / 16 * (K / 256) * static_cast<int64_t>(sizeof(R16Group<Block>));
}

// The 6-bit scale and min of sub-block j (ggml's get_scale_min_k4) from a block's 12 scale bytes.
inline void k4_scale_min(const uint8_t* q, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Values 8 i .. 8 i + 7 as the copy's 4 bytes: 8 bytes at p, their low (high) nibbles when shift is 0 (4), the
// first 4 in the low nibbles of the result, the last 4 in the high
inline uint32_t r16_quad_pair(const uint8_t* p, int shift) {
  uint64_t u;
  std::memcpy(&u, p, 8);
  u = (u >> shift) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<uint32_t>((u & 0xffffffffull) | ((u >> 32) << 4));
}

// w: rows x K values in Block (has_r16; rows a multiple of 16, K of 256) -> out: r16_bytes<Block>(rows, K) bytes
// (layout above).
template <typename Block>
inline void repack_r16(const uint8_t* w, int64_t rows, int64_t K, uint8_t* out) {
  constexpr bool k4 = std::is_same_v<Block, Q4_KBlock>;
  const int64_t nsb = K / 256, row_bytes = K / Block::QK * Block::BYTES;
  at::parallel_for(0, rows / 16, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t i = 0; i < nsb; ++i)
        for (int r = 0; r < 16; ++r) {
          const uint8_t* row = w + (16 * g + r) * row_bytes;
          if constexpr (k4) {
            auto* o = reinterpret_cast<R16Q4K*>(out) + g * nsb + i;
            const uint8_t* b = row + i * Q4_KBlock::BYTES;  // [d][dmin][scales 12][qs 128]
            std::memcpy(&o->d[r], b, 2), std::memcpy(&o->dmin[r], b + 2, 2);
            for (int s = 0; s < 8; ++s) k4_scale_min(b + 4, s, o->sc[s][r], o->m[s][r]);
            // qs[32 j + l]: value 64 j + l (low nibble), 64 j + 32 + l (high): values 8 t .. 8 t + 7 are nibbles
            // (t % 8 >= 4: high) of the 8 bytes at 32 (t / 8) + 8 (t % 4)
            for (int t = 0; t < 32; ++t) {
              const uint32_t v = r16_quad_pair(b + 16 + 32 * (t / 8) + 8 * (t % 4), t % 8 >= 4 ? 4 : 0);
              std::memcpy(&o->qs[t][4 * r], &v, 4);
            }
          } else {
            auto* o = reinterpret_cast<R16Q40*>(out) + g * nsb + i;
            for (int s = 0; s < 8; ++s) {
              const uint8_t* b = row + (8 * i + s) * Q4_0Block::BYTES;  // [d][qs 16]: value l low, l + 16 high
              std::memcpy(&o->d[s][r], b, 2);
              for (int u = 0; u < 4; ++u) {  // values 8 u .. 8 u + 7 of the block: t = 4 s + u
                const uint32_t v = r16_quad_pair(b + 2 + 8 * (u % 2), u >= 2 ? 4 : 0);
                std::memcpy(&o->qs[4 * s + u][4 * r], &v, 4);
              }
            }
          }
        }
  });
}

#if defined(SCRATCHLM_FIXED24)
// Row `row` of the copy w (K values per row), values [k0, k0 + kc) (multiples of 256), widened into out: the values
// widen_block<Block> makes of the file's blocks, bit for bit (w = fma(q, s, t) with s = d sc, t = -(dmin m) for
// Q4_K, s = d, t = -8 d for Q4_0: each product exact, one rounding). Per 32 values: the row's 4 bytes of each of
// 4 lines of qs (values 8 u .. 8 u + 3 in the low nibbles of line u's bytes, 8 u + 4 .. 8 u + 7 in the high).
template <typename Block>
inline void r16_widen_row(const uint8_t* w, int64_t K, int64_t row, int64_t k0, int64_t kc, float* out) {
  using Group = R16Group<Block>;
  constexpr bool k4 = std::is_same_v<Block, Q4_KBlock>;
  const int64_t nsb = K / 256;
  const int r = static_cast<int>(row % 16);
  const __m128i nib = _mm_set1_epi8(0x0f);
  for (int64_t i = k0 / 256; i < (k0 + kc) / 256; ++i, out += 256) {
    const Group& b = reinterpret_cast<const Group*>(w)[row / 16 * nsb + i];
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
}

// 4 bytes at p in every int32 lane
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows 16 g .. 16 g + 15 for NB batch rows (x of batch row b: xs[b]) into out[b * 16 + r]: each weight register
// loaded once and multiplied with every batch row's digits (the passes of up to 8 rows of a short batch read the
// copy NB at a time). The group's bytes are one stream, and the next group's follow: the prefetch 3 KB ahead runs
// on into them (two groups at once, two streams with a cold start each, ran 0.95-0.98x gemv_fixed24.h in the 1B
// decode where this runs 1.09-1.22x; 6 and 10 KB ahead 1.00-1.20x).
template <typename Block, int NB>
inline void r16_group(const Fixed24X* const* xs, const uint8_t* w, int64_t nsb, int64_t g, float* out) {
  using Group = R16Group<Block>;
  constexpr bool k4 = std::is_same_v<Block, Q4_KBlock>;
  constexpr int H = NB == 1 ? 2 : 1;  // one row: a sum per half sub-block (two chains); more rows: one each
  const __m512i nib = _mm512_set1_epi8(0x0f);
  __m512 tot[NB][H], off[NB];
  for (int b = 0; b < NB; ++b) {
    off[b] = _mm512_setzero_ps();
    for (int h = 0; h < H; ++h) tot[b][h] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < nsb; ++i) {
    const Group& blk = reinterpret_cast<const Group*>(w)[g * nsb + i];
    __m512 d = _mm512_setzero_ps(), dmin = d;
    if constexpr (k4) {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.d)));
      dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.dmin)));
    }
#pragma GCC unroll 1
    for (int s = 0; s < 8; ++s) {  // not unrolled: the copies' registers spilled (-35% in cache)
      __m512 scale, sub;  // w = scale q - sub, per row
      if constexpr (k4) {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.sc[s]))));
        const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.m[s]))));
        scale = _mm512_mul_ps(sc, d), sub = _mm512_mul_ps(m, dmin);
      } else {
        scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.d[s])));
        sub = _mm512_mul_ps(scale, _mm512_set1_ps(8.0f));
      }
      const int8_t* x[NB];  // values 32 s .. 32 s + 31 in chunk s / 2 of super-block i: planes a2, a1, a0
      for (int b = 0; b < NB; ++b) {
        off[b] = _mm512_fnmadd_ps(sub, _mm512_set1_ps(xs[b]->k4o[16 * i + 8 + s]), off[b]);
        x[b] = xs[b]->index + i * 4 * 192 + (s / 2) * 192 + (s % 2) * 32;
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // values 32 s + 16 h .. + 15
        __m512i a2[NB], a1[NB], a0[NB];
        for (int b = 0; b < NB; ++b) a2[b] = a1[b] = a0[b] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          const int t = 4 * s + 2 * h + u;  // values 8 t .. 8 t + 7: x's quads 2 t, 2 t + 1
          _mm_prefetch(reinterpret_cast<const char*>(blk.qs[t]) + 48 * 64, _MM_HINT_T0);
          const __m512i z = _mm512_loadu_si512(blk.qs[t]);
          const __m512i lo = _mm512_and_si512(z, nib), hi = f24_take(z, 4, 4, 4);
          for (int b = 0; b < NB; ++b) {
            const int8_t* xb = x[b] + 16 * h + 8 * u;
            a2[b] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a2[b], lo, bcast4(xb)), hi, bcast4(xb + 4));
            a1[b] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a1[b], lo, bcast4(xb + 64)), hi, bcast4(xb + 68));
            a0[b] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a0[b], lo, bcast4(xb + 128)), hi, bcast4(xb + 132));
          }
        }
        for (int b = 0; b < NB; ++b) {
          const __m512i p =
              _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(a2[b], 16), _mm512_slli_epi32(a1[b], 8)), a0[b]);
          // scale 2^-k exact: times a power of two
          const __m512 sk = _mm512_mul_ps(scale, _mm512_set1_ps(xs[b]->k4s[16 * i + s]));
          tot[b][h % H] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sk, tot[b][h % H]);
        }
      }
    }
  }
  for (int b = 0; b < NB; ++b) {
    __m512 sum = tot[b][0];
    if constexpr (H == 2) sum = _mm512_add_ps(sum, tot[b][1]);
    _mm512_storeu_ps(out + 16 * b, _mm512_add_ps(sum, off[b]));
  }
}

// y[b * ldy + n0 .. n1) for the B batch rows x (B <= R16_MAX_ROWS) from the repacked copy w, up to 4 batch rows per
// read of a group (groups cut by [n0, n1) are computed whole, stored in part). Up to 64 rows this beats widening
// the copy for block_gemm.h's fp32 GEMM (one process, 2 threads, Q4_K 8192 x 2048 / 2048 x 8192: 1.66x at 4 rows,
// 1.24-1.29x at 16, 1.03-1.07x at 64, 0.98-1.01x at 128: the integer products' 3 planes cost what fp32 FMAs do).
constexpr int64_t R16_MAX_ROWS = 64;
template <typename Block>
inline void r16_rows(const Fixed24X* const* xs, int64_t B, const uint8_t* w, float* y, int64_t ldy, int64_t n0,
                     int64_t n1) {
  const int64_t nsb = xs[0]->K / 256;
  alignas(64) float out[4 * 16];
  for (int64_t g = n0 / 16; g < (n1 + 15) / 16; ++g)
    for (int64_t b0 = 0; b0 < B; b0 += 4) {
      const int64_t nb = std::min<int64_t>(4, B - b0);
      switch (nb) {
        case 1: r16_group<Block, 1>(xs + b0, w, nsb, g, out); break;
        case 2: r16_group<Block, 2>(xs + b0, w, nsb, g, out); break;
        case 3: r16_group<Block, 3>(xs + b0, w, nsb, g, out); break;
        default: r16_group<Block, 4>(xs + b0, w, nsb, g, out);
      }
      for (int64_t b = 0; b < nb; ++b)
        for (int r = std::max<int64_t>(0, n0 - 16 * g); r < 16 && 16 * g + r < n1; ++r)
          y[(b0 + b) * ldy + 16 * g + r] = out[16 * b + r];
    }
}
#else
constexpr int64_t R16_MAX_ROWS = 64;
template <typename Block>
inline void r16_rows(const Fixed24X* const*, int64_t, const uint8_t*, float*, int64_t, int64_t, int64_t) {}
template <typename Block>
inline void r16_widen_row(const uint8_t*, int64_t, int64_t, int64_t, int64_t, float*) {}
#endif

}  // namespace scratchlm
