// One batch row of a Q4_K or Q4_0 matrix from a copy of its blocks repacked 16 rows at a time, lanes = rows
// (AVX512-VNNI): x as gemv_fixed24.h's 24-bit fixed point, its digits broadcast, every product and 16-value sum exact
// in integers.
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
// In cache one Zen 4 core runs 25-26 GB/s of Q4_K against gemv_fixed24.h's 17; the 1B Q4_K_M decode on two
// threads 1.03-1.22x (benchmarks/RESULTS.md, sixteenth session). Made by default where built (kernels/ops.py's
// `repacked`; SCRATCHLM_REPACK=0: none).
//
// The copy is made once per matrix (repack_r16) and read only by one batch row; prompts and the other routes read
// the file's blocks, so the process holds both (a layout that replaced the blocks would need block_gemm.h / gemv.h /
// dequantize to read it). Per 16 rows and 256 values:
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
// 4 bytes at p in every int32 lane
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows 16 g .. 16 g + 15 into out. The group's bytes are one stream, and the next group's follow: the prefetch 3 KB
// ahead runs on into them (two groups at once, two streams with a cold start each, ran 0.95-0.98x gemv_fixed24.h in
// the 1B decode where this runs 1.09-1.22x; 6 and 10 KB ahead 1.00-1.20x).
template <typename Block>
inline void r16_group(const Fixed24X& xf, const uint8_t* w, int64_t nsb, int64_t g, float* out) {
  using Group = R16Group<Block>;
  constexpr bool k4 = std::is_same_v<Block, Q4_KBlock>;
  const __m512i nib = _mm512_set1_epi8(0x0f);
  __m512 tot[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, off = _mm512_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i) {
    const int8_t* xi = xf.index + i * 4 * 192;  // the super-block's 4 chunks of 64 values: planes a2, a1, a0
    const Group& b = reinterpret_cast<const Group*>(w)[g * nsb + i];
    __m512 d = _mm512_setzero_ps(), dmin = d;
    if constexpr (k4) {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.d)));
      dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.dmin)));
    }
#pragma GCC unroll 1
    for (int s = 0; s < 8; ++s) {  // not unrolled: the copies' registers spilled (-35% in cache)
      __m512 scale, sub;  // w = scale q - sub, per row
      if constexpr (k4) {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.sc[s]))));
        const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.m[s]))));
        scale = _mm512_mul_ps(sc, d), sub = _mm512_mul_ps(m, dmin);
      } else {
        scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.d[s])));
        sub = _mm512_mul_ps(scale, _mm512_set1_ps(8.0f));
      }
      scale = _mm512_mul_ps(scale, _mm512_set1_ps(xf.k4s[16 * i + s]));  // exact: times a power of two
      off = _mm512_fnmadd_ps(sub, _mm512_set1_ps(xf.k4o[16 * i + 8 + s]), off);
      const int8_t* xs = xi + (s / 2) * 192 + (s % 2) * 32;  // values 32 s .. 32 s + 31 in chunk s / 2
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // values 32 s + 16 h .. + 15
        __m512i a2 = _mm512_setzero_si512(), a1 = a2, a0 = a2;
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          const int t = 4 * s + 2 * h + u;  // values 8 t .. 8 t + 7: x's quads 2 t, 2 t + 1
          const int8_t* x = xs + 16 * h + 8 * u;
          _mm_prefetch(reinterpret_cast<const char*>(b.qs[t]) + 48 * 64, _MM_HINT_T0);
          const __m512i z = _mm512_loadu_si512(b.qs[t]);
          const __m512i lo = _mm512_and_si512(z, nib), hi = f24_take(z, 4, 4, 4);
          a2 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a2, lo, bcast4(x)), hi, bcast4(x + 4));
          a1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a1, lo, bcast4(x + 64)), hi, bcast4(x + 68));
          a0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a0, lo, bcast4(x + 128)), hi, bcast4(x + 132));
        }
        const __m512i p = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(a2, 16), _mm512_slli_epi32(a1, 8)), a0);
        tot[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, tot[h]);
      }
    }
  }
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(tot[0], tot[1]), off));
}

// y[n0 .. n1) of one batch row from the repacked copy w (groups cut by [n0, n1) are computed whole, stored in part).
template <typename Block>
inline void r16_rows(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  const int64_t nsb = xf.K / 256;
  alignas(64) float out[16];
  for (int64_t g = n0 / 16; g < (n1 + 15) / 16; ++g) {
    r16_group<Block>(xf, w, nsb, g, out);
    for (int r = std::max<int64_t>(0, n0 - 16 * g); r < 16 && 16 * g + r < n1; ++r) y[16 * g + r] = out[r];
  }
}
#else
template <typename Block>
inline void r16_rows(const Fixed24X&, const uint8_t*, float*, int64_t, int64_t) {}
#endif

}  // namespace scratchlm
