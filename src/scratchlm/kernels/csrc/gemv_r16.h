// Up to 64 batch rows of a Q4_K, Q4_0, Q2_K or Q3_K matrix from its copy repacked 16 rows at a time
// (r16_layout.h), lanes = rows (AVX512-VNNI): x as gemv_fixed24.h's 24-bit fixed point, its digits broadcast, every
// product and 16-value sum exact in integers.
//
// gemv_fixed24.h reads the file's blocks in place: a register holds 64 values of one row, so each 64 weights
// also cost a permute of the scales, a conversion and an FMA, and two shifts join the three digit planes (~9
// vector ops per 64 weights). Here a register holds 4 values of each of 16 rows (int32 lane r = row r), so x's 4
// digits of those values are one broadcast operand of vpdpbusd, the three planes accumulate apart for 16 values
// of x and are joined once (two shifts, two adds), and the scales are a vector per 32 values (~5.5 ops per 64):
//   P_r = sum over 16 values v of q_rv X_v = 65536 sum q a2 + 256 sum q a1 + sum q a0   (exact in int32:
//         16 * 15 * (2^23 - 2^16) < 2^31; the planes' sums are taken mod 2^32 and the total fits)
//   y_r = sum over 32-value blocks s ( s_rs 2^-k_s * sum of its two P_r  +  t_rs * sum_s x~ )
// with w = s q + t: Q4_K s = d sc, t = -dmin m; Q4_0 s = d, t = -8 d; Q2_K and Q3_K per 16 values (their
// groups' sums of x~, Fixed24X::g16o), s = d sc, t = -dmin m and s = d (sc - 32), t = -4 s (all exact in fp32):
// the same terms as gemv_fixed24.h's (x~ = X 2^-k, per 32 values, so K must be a multiple of 256), another fp32
// order. In cache one Zen 4 core runs 25-26 GB/s of Q4_K against gemv_fixed24.h's 17. Made by default where built
// (kernels/ops.py's `repacked`; SCRATCHLM_REPACK=0: none).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gemv_fixed24.h"
#include "r16_layout.h"

namespace scratchlm {

#if defined(SCRATCHLM_FIXED24)
// 4 bytes at p in every int32 lane
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows 16 g .. 16 g + 15 for NB batch rows (x of batch row b: xs[b]) into out[b * 16 + r]: each weight register
// loaded once and multiplied with every batch row's digits (r16_rows reads each group once per 4 batch rows of a
// batch of up to 64). The group's bytes are one stream, and the next group's follow: the prefetch 3 KB ahead runs
// on into them (two groups at once, two streams with a cold start each, ran 0.95-0.98x gemv_fixed24.h in the 1B
// decode where this runs 1.09-1.22x; 6 and 10 KB ahead 1.00-1.20x).
template <typename Block, int NB>
inline void r16_group(const Fixed24X* const* xs, const uint8_t* w, int64_t nsb, int64_t g, float* out) {
  using Group = R16Group<Block>;
  constexpr bool k4 = std::is_same_v<Block, Q4_KBlock>, k3 = std::is_same_v<Block, Q3_KBlock>;
  constexpr bool planes = r16_planes<Block>();  // Q2_K / Q3_K: q in 2-bit planes (+ a bit plane), scales per 16
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
    if constexpr (k4 || planes) d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.d)));
    if constexpr (k4 || (planes && !k3))
      dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.dmin)));
#pragma GCC unroll 1
    for (int s = 0; s < 8; ++s) {  // not unrolled: the copies' registers spilled (-35% in cache)
      __m512 scale = d, sub = d;  // w = scale q - sub, per row (Q2_K / Q3_K: per 16 values, below)
      __m512i pl[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      if constexpr (planes) {
        for (int j = 0; j < (k3 ? 3 : 2); ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(blk.q[s][j]) + 48 * 64, _MM_HINT_T0);
          pl[j] = _mm512_loadu_si512(blk.q[s][j]);
        }
      } else if constexpr (k4) {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.sc[s]))));
        const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.m[s]))));
        scale = _mm512_mul_ps(sc, d), sub = _mm512_mul_ps(m, dmin);
      } else {
        scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.d[s])));
        sub = _mm512_mul_ps(scale, _mm512_set1_ps(8.0f));
      }
      const int8_t* x[NB];  // values 32 s .. 32 s + 31 in chunk s / 2 of super-block i: planes a2, a1, a0
      for (int b = 0; b < NB; ++b) {
        if constexpr (!planes) off[b] = _mm512_fnmadd_ps(sub, _mm512_set1_ps(xs[b]->k4o[16 * i + 8 + s]), off[b]);
        x[b] = xs[b]->index + i * 4 * 192 + (s / 2) * 192 + (s % 2) * 32;
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // values 32 s + 16 h .. + 15
        if constexpr (planes) {  // group 2 s + h's scale and offset against x~'s sum over its 16 values
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.sc[2 * s + h]));
          if constexpr (k3) {
            scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), d);
            sub = _mm512_mul_ps(scale, _mm512_set1_ps(4.0f));
          } else {
            const __m128i lo4 = _mm_set1_epi8(0x0f);
            scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, lo4))), d);
            sub = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), lo4))), dmin);
          }
          for (int b = 0; b < NB; ++b)
            off[b] = _mm512_fnmadd_ps(sub, _mm512_set1_ps(xs[b]->g16o[16 * i + 2 * s + h]), off[b]);
        }
        __m512i a2[NB], a1[NB], a0[NB];
        for (int b = 0; b < NB; ++b) a2[b] = a1[b] = a0[b] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          [[maybe_unused]] const int t = 4 * s + 2 * h + u;  // values 8 t .. 8 t + 7: x's quads 2 t, 2 t + 1
          __m512i lo, hi;
          if constexpr (planes) {  // field f = t % 4 of the planes: 2 bits (and Q3_K's third)
            const int f = 2 * h + u;
            lo = f24_take(pl[0], 2 * f, 2 * f, 2), hi = f24_take(pl[1], 2 * f, 2 * f, 2);
            if constexpr (k3) {
              lo = _mm512_or_si512(lo, f24_take(pl[2], f, f, 1, 2));
              hi = _mm512_or_si512(hi, f24_take(pl[2], 4 + f, 4 + f, 1, 2));
            }
          } else {
            _mm_prefetch(reinterpret_cast<const char*>(blk.qs[t]) + 48 * 64, _MM_HINT_T0);
            const __m512i z = _mm512_loadu_si512(blk.qs[t]);
            lo = _mm512_and_si512(z, nib), hi = f24_take(z, 4, 4, 4);
          }
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
#endif

}  // namespace scratchlm
