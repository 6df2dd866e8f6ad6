// One batch row (decoding) of y = x @ W^T on the K-quants Q2_K / Q3_K / Q4_K / Q5_K / Q6_K with AVX512-VNNI: x as
// 24-bit fixed point per 32 values, every product and sum exact in integers (vpdpbusd), fp32 only after.
//
// x is rounded once per call (Fixed24X), per 32-value block b with a power of two 2^k_b:
//   X_i = rne(x_i 2^k_b)  (int32),   k_b the largest k with max_b |x_i| 2^k <= 2^23 - 2^16 (FIXED24_MAX)
// so x~_i = X_i 2^-k_b differs from x_i by at most 2^-(k_b + 1) < max_b |x| / FIXED24_MAX (~1.2e-7 of the
// block's largest value: about the rounding of that value's own fp32 products). Each X is three int8 digits,
// X = 65536 a2 + 256 a1 + a0 (balanced base 256: a0 the low byte read as int8, and so on).
// A weight block holds w = s q + t (q unsigned: 0..3 / 7 / 15 / 31 / 63; s, t per sub-block: blocks.h), so
//   x~ . W[n] = sum over sub-blocks ( s 2^-k * sum_i q_i X_i  +  t * sum_i x~_i )
// where, per 4 consecutive values (one int32 lane of vpdpbusd), sum q X = ((q.a2) 256 + q.a1) 256 + q.a0:
// three dot products and two shifts, exact: |lane| <= 4 * 63 * (128 * 65793) < 2^31 at every step. Then each lane
// is converted to fp32 (one rounding), multiplied by its sub-block's s 2^-k (exact: d sc is exact in fp32, 2^-k
// a power of two) and summed in fp32. The t terms use sum_i X_i 2^-k (exact integer sums, one rounding).
// So y = F.linear(x~, dequantized W) up to fp32 rounding, and |y - F.linear(x, W)| <= sum_i |w_i| max_b |x| /
// FIXED24_MAX more (tests/kernels/test_fixed24.py checks both against float64).
//
// Why: the fp32 forms (gemv.h's widening, gemv_centered512.h) spend ~5 vector ops per 16 weights and run ~20 GB/s
// of Q4_K per Zen 5 core, under what two cores can stream; here ~2.5 ops per 16 weights: per 64 weights three
// vpdpbusd, two shifts, one conversion, one permute of the scales, one FMA, and the quants' unpacking; the scales
// of 4 rows are unpacked in one register. Zen 5, K 2048: Q4_K 35 vs 21 GB/s per core in cache, 49 vs 33 GB/s
// streaming on two threads (benchmarks/RESULTS.md).
//
// Layout: a chunk is one 64-byte register of quants (64 values, one per byte); lanes 0-7 / 8-15 of vpdpbusd hold
// two 32-value halves. Q4_K / Q5_K: 64 bytes of qs hold sub-blocks 4j, 4j + 2 in their low nibbles (chunk 2j) and
// 4j + 1, 4j + 3 in their high nibbles (chunk 2j + 1): the "pair" order of x. Q6_K: 64 bytes of ql hold values
// 128j .. 128j + 63 in their low nibbles (chunk 2j), 128j + 64 .. + 127 in the high: x in index order. Q2_K / Q3_K:
// 32 bytes of qs hold values 128j + 32g + l in bits 2g, 2g + 1 of byte l (Q3_K's third bit: bit 4j + g of
// hmask[l]): both halves of a register read the 32 bytes, shifted by 2g for their group; index order.

#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "blocks.h"
#include "gemv_a8_blocks.h"
#include "simd.h"

namespace scratchlm {

#if defined(SCRATCHLM_AVX512) && defined(__AVX512VNNI__)
#define SCRATCHLM_FIXED24 1
#elif defined(SCRATCHLM_AVX2)
#define SCRATCHLM_FIXED24_AVX2 1  // the K-quants: gemv_fixed24_avx2.h (Q4_0 / Q4_1 / Q5_0 / Q5_1: _b32_avx2.h)
#endif

constexpr int32_t FIXED24_MAX = (1 << 23) - (1 << 16);  // |X| bound: the top digit stays in int8 (see above)
// Values per power of two 2^k of x: 32 with AVX512-VNNI; 256 (a super-block) on AVX2, where gemv_fixed24_avx2.h sums
// a super-block's sub-blocks in integers before one conversion
#if defined(SCRATCHLM_FIXED24)
constexpr int FIXED24_GROUP = 32;
#else
constexpr int FIXED24_GROUP = 256;
#endif

// Whether one batch row of a type with a fixed24 kernel takes it (the default) or the fp32 kernels: the module's
// set_fixed24, for tests and benchmarks that compare the two in one process.
inline std::atomic<bool> fixed24_enabled{true};

template <typename Block>
constexpr bool has_fixed24() {
#if defined(SCRATCHLM_FIXED24)
  return std::is_same_v<Block, Q2_KBlock> || std::is_same_v<Block, Q3_KBlock> || std::is_same_v<Block, Q4_KBlock> ||
         std::is_same_v<Block, Q5_KBlock> || std::is_same_v<Block, Q6_KBlock>;
#elif defined(SCRATCHLM_FIXED24_AVX2)
  return std::is_same_v<Block, Q2_KBlock> || std::is_same_v<Block, Q3_KBlock> || std::is_same_v<Block, Q4_KBlock> ||
         std::is_same_v<Block, Q5_KBlock> || std::is_same_v<Block, Q6_KBlock>;
#else
  return false;
#endif
}

#if defined(SCRATCHLM_FIXED24)
// The 32 values at x rounded as above: X[0] / X[1] the int32 X of values 0-15 / 16-31; returns 2^-k (0 for an
// all-zero block, NaN when x holds an inf or a NaN: y is then NaN, as fp32's).
inline float fixed24_round32(const float* x, __m512i* X) {
  constexpr int RNE = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  X[0] = X[1] = _mm512_setzero_si512();
  if (!std::isfinite(amax)) return std::nanf("");
  if (amax == 0.0f) return 0.0f;
  int e;
  std::frexp(amax, &e);  // amax = m 2^e, m in [0.5, 1)
  int k = 23 - e;
  if (std::ldexp(amax, k) > static_cast<float>(FIXED24_MAX)) --k;
  const __m512 p = _mm512_set1_ps(static_cast<float>(k));
  X[0] = _mm512_cvt_roundps_epi32(_mm512_scalef_ps(x0, p), RNE);  // x 2^k exactly, then to nearest even
  X[1] = _mm512_cvt_roundps_epi32(_mm512_scalef_ps(x1, p), RNE);
  return std::ldexp(1.0f, -k);
}

// The balanced base-256 digits of 16 X values, one int8 each: d[0] = a2, d[1] = a1, d[2] = a0 (X = 65536 a2 +
// 256 a1 + a0; a0 the low byte read as int8, a1 the low byte of (X - a0) / 256, a2 the rest).
inline void fixed24_digits(__m512i a0, __m128i* d) {
  const __m512i r1 = _mm512_srai_epi32(_mm512_sub_epi32(a0, _mm512_srai_epi32(_mm512_slli_epi32(a0, 24), 24)), 8);
  const __m512i a2 = _mm512_srai_epi32(_mm512_sub_epi32(r1, _mm512_srai_epi32(_mm512_slli_epi32(r1, 24), 24)), 8);
  d[0] = _mm512_cvtepi32_epi8(a2), d[1] = _mm512_cvtepi32_epi8(r1), d[2] = _mm512_cvtepi32_epi8(a0);
}
#endif

#if defined(SCRATCHLM_FIXED24_AVX2)
// fixed24_round32's rounding in AVX2 over n values (a multiple of 8) with one power of two: X[l] = rne(x_l 2^k),
// k from max |x| over all n; returns 2^-k (0 for all zeros, NaN when x holds an inf or a NaN)
inline float fixed24_round_avx2(const float* x, int n, int32_t* X) {
  for (int j = 0; j < n; j += 8) _mm256_storeu_si256(reinterpret_cast<__m256i*>(X + j), _mm256_setzero_si256());
  bool bad;
  const float amax = abs_max8(x, n, &bad);
  if (bad) return std::nanf("");
  if (amax == 0.0f) return 0.0f;
  int e;
  std::frexp(amax, &e);  // amax = m 2^e, m in [0.5, 1)
  int k = 23 - e;  // >= -105 (amax < 2^128)
  if (std::ldexp(amax, k) > static_cast<float>(FIXED24_MAX)) --k;
  // x 2^k exactly: one multiply by a power of two for k <= 127 (a subnormal product is < 0.5 and rounds to 0 either
  // way), two past it (2^64, then the rest: scaling a small value up loses no bits)
  const __m256 p1 = _mm256_set1_ps(std::ldexp(1.0f, k > 127 ? 64 : k));
  const __m256 p2 = _mm256_set1_ps(std::ldexp(1.0f, k > 127 ? k - 64 : 0));
  for (int j = 0; j < n; j += 8) {  // to nearest even (MXCSR's default rounding)
    const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), p1), p2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(X + j), r);
  }
  return std::ldexp(1.0f, -k);
}
#endif

#if defined(SCRATCHLM_FIXED24_AVX2)
// X's balanced base-256 digits {a2, a1, a0} (X = 65536 a2 + 256 a1 + a0, a0 the low byte read as int8, a1 the low
// byte of (X - a0) / 256, a2 the rest), one value at a time
inline std::array<int8_t, 3> fixed24_split(int32_t X) {
  const int32_t a0 = static_cast<int8_t>(X & 0xff), r1 = (X - a0) >> 8;
  const int32_t a1 = static_cast<int8_t>(r1 & 0xff), a2 = (r1 - a1) >> 8;
  return {static_cast<int8_t>(a2), static_cast<int8_t>(a1), static_cast<int8_t>(a0)};
}
#endif

// The NR rows of a tile from row n (rows past n_end - 1 repeat the last row: computed, not written)
template <int NR>
inline void tile_rows(const uint8_t* w, int64_t n, int64_t n_end, int64_t row_bytes, const uint8_t** row) {
  for (int r = 0; r < NR; ++r) row[r] = w + std::min(n + r, n_end - 1) * row_bytes;
}

// Rows [n0, n1) in tiles of 4 rows: tile(planes, n, row_bytes) with planes an integral_constant, 3 for x's three
// digit planes and 1 for the A8 form's one (the fixed-point kernels' row loop)
template <typename Block, typename XF, typename Tile>
inline void fixed24_tiles(const XF& xf, int64_t n0, int64_t n1, const Tile& tile) {
  const int64_t row_bytes = (xf.K / Block::QK) * Block::BYTES;
  for (int64_t n = n0; n < n1; n += 4)
    xf.planes == 3 ? tile(std::integral_constant<int, 3>{}, n, row_bytes) : tile(std::integral_constant<int, 1>{}, n, row_bytes);
}

// x of one batch row, rounded (see above), for both chunk orders. Per 256-value super-block i:
//   pair / index: chunk c (0..3) at (4 i + c) * 192: digits a2, a1, a0 (64 bytes each) of the chunk's 64 values
//                 (prepare_q8: at (4 i + c) * 64, the one digit q)
//   k4s / k4o (16 floats): 2^-k of sub-block s in lane s; sum of x~ over sub-block s in lane 8 + s (Q4_K / Q5_K)
//   g16s / g16o (16 floats): 2^-k of 16-value group g in lane g; its sum of x~ (the index-order types)
struct Fixed24X {
  std::vector<int8_t> dig;
  std::vector<float> flt;
  int8_t *pair = nullptr, *index = nullptr;
  float *k4s = nullptr, *k4o = nullptr, *g16s = nullptr, *g16o = nullptr;
  int64_t K = 0;
  int planes = 3;  // digits per value: 3 (24-bit X), or 1 (prepare_q8: the A8 rounding's int8 q)

  // the digits, 2^-k and sums of x in pair order (Q4_K / Q5_K) or index order (the rest)
  struct Order {
    const int8_t* dig;
    const float *scale, *sums;
  };
  Order order(bool pair_order) const {
    return pair_order ? Order{pair, k4s, k4o} : Order{index, g16s, g16o};
  }

  Fixed24X() = default;
  Fixed24X(const Fixed24X&) = delete;
  Fixed24X& operator=(const Fixed24X&) = delete;

#if defined(SCRATCHLM_FIXED24) || defined(SCRATCHLM_FIXED24_AVX2)
  void layout(int64_t K_, int planes_) {
    K = K_, planes = planes_;
    const int64_t nsb = K / 256;
    dig.resize(2 * nsb * 256 * planes + 64);
    flt.assign(4 * nsb * 16 + 16, 0.0f);
    pair = dig.data() + (64 - reinterpret_cast<uintptr_t>(dig.data()) % 64) % 64;
    index = pair + nsb * 256 * planes;
    float* f = flt.data() + (16 - reinterpret_cast<uintptr_t>(flt.data()) / sizeof(float) % 16) % 16;
    k4s = f, k4o = f + nsb * 16, g16s = f + 2 * nsb * 16, g16o = f + 3 * nsb * 16;
  }

  // Where digit plane `plane` of 32-value block s of super-block i starts: in pair order (chunk 2 (s / 4) + s % 2,
  // half (s % 4) / 2) and in index order (chunk s / 2, half s % 2); 32 bytes each
  int8_t* pair_at(int64_t i, int64_t s, int plane) const {
    return pair + ((4 * i + 2 * (s / 4) + s % 2) * planes + plane) * 64 + 32 * ((s % 4) / 2);
  }
  int8_t* index_at(int64_t i, int64_t s, int plane) const {
    return index + ((4 * i + s / 2) * planes + plane) * 64 + 32 * (s % 2);
  }

  // One row rounded the A8 way for the K-quants (gemv_a8_blocks.h's ActRows, qk 256: ggml's Q8_K, x ~ d q): one
  // digit plane (q), 2^-k replaced by the block's d, the sums by d sum q (a.xs). The kernels then compute
  // round(x) W^T, the A8 row formats' definition, with one vpdpbusd per 64 weights.
  void prepare_q8(const ActRows& a) {
    layout(a.K, 1);
    for (int64_t i = 0; i < K / 256; ++i) {
      const float d = a.d[i];
      for (int64_t s = 0; s < 8; ++s) {
        const int8_t* q = a.q.data() + 256 * i + 32 * s;
        std::memcpy(pair_at(i, s, 0), q, 32);
        std::memcpy(index_at(i, s, 0), q, 32);
        const float x0 = a.xs[16 * i + 2 * s], x1 = a.xs[16 * i + 2 * s + 1];
        k4s[16 * i + s] = d;
        k4o[16 * i + 8 + s] = x0 + x1;
        g16s[16 * i + 2 * s] = g16s[16 * i + 2 * s + 1] = d;
        g16o[16 * i + 2 * s] = x0, g16o[16 * i + 2 * s + 1] = x1;
      }
    }
  }

  // x: K values, K a multiple of 256. Per block of FIXED24_GROUP values: X (one 2^-k), its three digit planes in
  // both orders, and (store_sums) its 2^-k and the sums of x~ over each 32-value sub-block (k4o) and each half
  // (g16o), exact integers times 2^-k.
  void prepare(const float* x, int64_t K_) {
    layout(K_, 3);
#if defined(SCRATCHLM_FIXED24)
    for (int64_t b = 0; b < K / 32; ++b) {
      const int64_t i = b / 8, s = b % 8;
      int32_t half_sum[2] = {0, 0};
      __m512i X[2];
      const float xsc = fixed24_round32(x + 32 * b, X);
      for (int h = 0; h < 2; ++h) {
        __m128i d[3];
        fixed24_digits(X[h], d);
        for (int plane = 0; plane < 3; ++plane) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(pair_at(i, s, plane) + 16 * h), d[plane]);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(index_at(i, s, plane) + 16 * h), d[plane]);
        }
        half_sum[h] = _mm512_reduce_add_epi32(X[h]);  // |sum| <= 16 * 2^23: exact
      }
      store_sums(i, s, xsc, half_sum);
    }
#else
    for (int64_t i = 0; i < K / 256; ++i) {  // AVX2: one 2^-k per super-block, the digits one value at a time
      alignas(32) int32_t X[256];
      const float xsc = fixed24_round_avx2(x + 256 * i, 256, X);
      for (int64_t s = 0; s < 8; ++s) {
        int32_t half_sum[2] = {0, 0};
        int8_t* pd[3] = {pair_at(i, s, 0), pair_at(i, s, 1), pair_at(i, s, 2)};
        int8_t* id[3] = {index_at(i, s, 0), index_at(i, s, 1), index_at(i, s, 2)};
        for (int l = 0; l < 32; ++l) {
          const std::array<int8_t, 3> d = fixed24_split(X[32 * s + l]);
          for (int plane = 0; plane < 3; ++plane) pd[plane][l] = id[plane][l] = d[plane];
          half_sum[l / 16] += X[32 * s + l];
        }
        store_sums(i, s, xsc, half_sum);
      }
    }
#endif
  }

  // 32-value block s of super-block i: its 2^-k and its sums of x~ (of its halves: half_sum, exact integers)
  void store_sums(int64_t i, int64_t s, float xsc, const int32_t* half_sum) {
    k4s[16 * i + s] = xsc;
    k4o[16 * i + 8 + s] = xsc * static_cast<float>(half_sum[0] + half_sum[1]);
    for (int h = 0; h < 2; ++h) {
      g16s[16 * i + 2 * s + h] = xsc;
      g16o[16 * i + 2 * s + h] = xsc * static_cast<float>(half_sum[h]);
    }
  }
#else
  void prepare(const float*, int64_t K_) { K = K_; }
  void prepare_q8(const ActRows& a) { K = a.K, planes = 1; }
#endif
};

#if defined(SCRATCHLM_FIXED24)
inline __m512i f24_bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
// (a & b) | c per bit (vpternlog)
constexpr int F24_AND_OR = 0xea;

// The matrix of a GF(2) affine map (vgf2p8affineqb) that moves bits from .. from + n - 1 of each byte to bits to ..
// to + n - 1 and clears the rest (output bit i reads the matrix's byte 7 - i): one instruction for a shift and a
// mask, which the shuffle / shift units would take two for
constexpr uint64_t f24_bits(int from, int n, int to = 0) {
  uint64_t a = 0;
  for (int i = 0; i < n; ++i) a |= static_cast<uint64_t>(1u << (from + i)) << (8 * (7 - to - i));
  return a;
}
// Each byte's bits from .. from + n - 1 moved to to .. to + n - 1, the rest cleared, with from = from_lo in the
// register's low 32 bytes and from_hi in the high 32 (to + n <= 8, from + n <= 8). With GFNI one affine map; without
// (e.g. Cascade Lake) a rotate of each 64-bit lane by (to - from) mod 64 and a mask: a rotation moves bit 8k + from + i
// to 8k + to + i, inside its own byte, so the masked field is exactly the source field
inline __m512i f24_take(__m512i z, int from_lo, int from_hi, int n, int to = 0) {
#if defined(__GFNI__)
  const uint64_t lo = f24_bits(from_lo, n, to), hi = f24_bits(from_hi, n, to);
  return _mm512_gf2p8affine_epi64_epi8(z, _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi), 0);
#else
  const int64_t rl = (64 + to - from_lo) % 64, rh = (64 + to - from_hi) % 64;
  return _mm512_and_si512(_mm512_rolv_epi64(z, _mm512_setr_epi64(rl, rl, rl, rl, rh, rh, rh, rh)),
                          _mm512_set1_epi8(static_cast<char>(((1 << n) - 1) << to)));
#endif
}

// the 4-value dot products of a chunk's quants q with X: exact int32 lanes (see the header)
inline __m512i f24_dot(__m512i q, const int8_t* d) {
  __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_load_si512(d));
  acc = _mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 8), q, _mm512_load_si512(d + 64));
  return _mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 8), q, _mm512_load_si512(d + 128));
}

// Q4_K / Q5_K: the scales of 4 blocks (rows) at once, as k4_unpack: v[r] lanes 0-7 d sc_j, lanes 8-15 -(dmin m_j)
inline void k4_scales_x4(const uint8_t* const* p, __m512* v) {
  __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0])));
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[1])), 1);
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[2])), 2);
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[3])), 3);
  // per 16 bytes [d dmin | u0 | u1 | u2]: scales 0-3 = u0 & 0x3f.., 4-7 = (u2 & 0x0f..) | (u0 >> 6 & 3..) << 4,
  // mins 0-3 = u1 & 0x3f.., mins 4-7 = (u2 >> 4 & 0x0f..) | (u1 >> 6 & 3..) << 4
  const __m512i a = _mm512_shuffle_epi32(z, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(3, 2, 3, 1)));  // u0 u2 u1 u2
  const __m512i b = _mm512_shuffle_epi32(z, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(2, 2, 1, 1)));  // .. u0 .. u1
  const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(a, _mm512_set4_epi32(4, 0, 0, 0)),
                                       _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
  const __m512i t = _mm512_ternarylogic_epi32(_mm512_srli_epi32(b, 2), _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0),
                                              low, F24_AND_OR);
  const __m128i dm = _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), z));
  const __m512 ds = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(dm), _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1)));
  const __m128i parts[4] = {_mm512_castsi512_si128(t), _mm512_extracti32x4_epi32(t, 1), _mm512_extracti32x4_epi32(t, 2),
                            _mm512_extracti32x4_epi32(t, 3)};
  for (int r = 0; r < 4; ++r) {
    const __m512 d = _mm512_permutexvar_ps(_mm512_setr_epi32(2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r, 2 * r + 1,
                                                             2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1, 2 * r + 1), ds);
    v[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(parts[r])), d);
  }
}

// Per type: PAIR (x in pair order), scales(p, v, m) for 4 rows (v: the scale of each lane's sub-block; m: what
// multiplies x's sums k4o / g16o into the offsets t), quants(p, j, q): chunks 2j, 2j + 1 of the block at p as
// unsigned bytes, and IDX[c]: the scale lane of each int32 lane of chunk c.
template <typename Block>
struct Fixed24;

#define SCRATCHLM_F24_SUB(a, b) a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b
alignas(64) inline constexpr int32_t F24_K4_IDX[4][16] = {
    {SCRATCHLM_F24_SUB(0, 2)}, {SCRATCHLM_F24_SUB(1, 3)}, {SCRATCHLM_F24_SUB(4, 6)}, {SCRATCHLM_F24_SUB(5, 7)}};
#undef SCRATCHLM_F24_SUB
#define SCRATCHLM_F24_GROUPS(c) 4 * c, 4 * c, 4 * c, 4 * c, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, \
    4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3
alignas(64) inline constexpr int32_t F24_Q6_IDX[4][16] = {
    {SCRATCHLM_F24_GROUPS(0)}, {SCRATCHLM_F24_GROUPS(1)}, {SCRATCHLM_F24_GROUPS(2)}, {SCRATCHLM_F24_GROUPS(3)}};
#undef SCRATCHLM_F24_GROUPS

template <>
struct Fixed24<Q4_KBlock> {  // [d][dmin][scales 12][qs 128]
  static constexpr bool PAIR = true;
  static constexpr const int32_t (*IDX)[16] = F24_K4_IDX;
  static void scales(const uint8_t* const* p, __m512* v, __m512* m) {
    k4_scales_x4(p, v);
    for (int r = 0; r < 4; ++r) m[r] = v[r];  // lanes 8-15: -(dmin m_j) against k4o's sums (lanes 0-7 of k4o are 0)
  }
  static void quants(const uint8_t* p, int j, __m512i* q) {
    const __m512i z = _mm512_loadu_si512(p + 16 + 64 * j);
    q[0] = _mm512_and_si512(z, f24_bytes(0x0f)), q[1] = f24_take(z, 4, 4, 4);
  }
};

template <>
struct Fixed24<Q5_KBlock> {  // [d][dmin][scales 12][qh 32][qs 128]: as Q4_K, q | (bit s of qh[l]) << 4, s the sub-block
  static constexpr bool PAIR = true;
  static constexpr const int32_t (*IDX)[16] = F24_K4_IDX;
  static void scales(const uint8_t* const* p, __m512* v, __m512* m) {
    k4_scales_x4(p, v);
    for (int r = 0; r < 4; ++r) m[r] = v[r];  // lanes 8-15: -(dmin m_j) against k4o's sums (lanes 0-7 of k4o are 0)
  }
  static void quants(const uint8_t* p, int j, __m512i* q) {
    const __m512i z = _mm512_loadu_si512(p + 48 + 64 * j), m = f24_bytes(0x0f);
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
    // bit s of qh[l] to bit 4, s the sub-block (4j, 4j + 2 | 4j + 1, 4j + 3)
    const int s0 = 4 * j;
    const __m512i h0 = f24_take(h, s0, s0 + 2, 1, 4);
    const __m512i h1 = f24_take(h, s0 + 1, s0 + 3, 1, 4);
    q[0] = _mm512_ternarylogic_epi32(z, m, h0, F24_AND_OR);
    q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 4), m, h1, F24_AND_OR);
  }
};

// Q3_K's scales, 4 rows at once (the values of blocks.h's prepare, which the scalar forms use): 16 bytes at p[r] +
// off in the 128-bit lane r
inline __m512i g16_bytes_x4(const uint8_t* const* p, int off) {
  __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0] + off)));
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[1] + off)), 1);
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[2] + off)), 2);
  return _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[3] + off)), 3);
}

// v[r] lane g = (int8 g of b's lane r) (the fp16 at p[r] + off) (exact: 8-bit integers times fp16 values fit
// fp32's 24 bits). Through memory: per row a broadcast scalar, as blocks.h's prepare (faster than the lane
// extracts and permutes on the shuffle units that the quants and scales use too)
inline void g16_times_x4(__m512i b, const uint8_t* const* p, int off, __m512* v) {
  alignas(64) int8_t sc[64];
  _mm512_store_si512(sc, b);
  for (int r = 0; r < 4; ++r)
    v[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16 * r)))),
                         _mm512_set1_ps(fp16_to_f32(p[r] + off)));
}

// The other index-order types: v and m from blocks.h's prepare, per row
template <typename Block>
inline void g16_scales_x4(const uint8_t* const* p, __m512* v, __m512* m) {
  alignas(64) float sc[32];
  for (int r = 0; r < 4; ++r) Block::prepare(p[r], sc), v[r] = _mm512_load_ps(sc), m[r] = _mm512_load_ps(sc + 16);
}

template <>
struct Fixed24<Q6_KBlock> {  // [ql 128][qh 64][scales 16 x int8][d]: w = d sc_g (q - 32), 16-value groups g
  static constexpr bool PAIR = false;
  static constexpr const int32_t (*IDX)[16] = F24_Q6_IDX;
  static void scales(const uint8_t* const* p, __m512* v, __m512* m) { g16_scales_x4<Q6_KBlock>(p, v, m); }
  static void quants(const uint8_t* p, int j, __m512i* q) {
    const __m512i z = _mm512_loadu_si512(p + 64 * j), m = f24_bytes(0x0f);
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * j)));
    // values 128j + l (+ 32): qh bits 0-1 (2-3) to bits 4-5; + 64 (+ 96): bits 4-5 (6-7)
    const __m512i h0 = f24_take(h, 0, 2, 2, 4);
    const __m512i h1 = f24_take(h, 4, 6, 2, 4);
    q[0] = _mm512_ternarylogic_epi32(z, m, h0, F24_AND_OR);
    q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 4), m, h1, F24_AND_OR);
  }
};

// Q2_K / Q3_K: the 2-bit parts of values 128j .. 128j + 127 as two registers of bytes 0..3: chunk 2j's halves take
// bits 0-1 / 2-3 of the 32 bytes of qs (in both halves), chunk 2j + 1's bits 4-5 / 6-7
inline void k23_low_bits(const uint8_t* qs, __m512i* z) {
  const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)));
  z[0] = f24_take(b, 0, 2, 2), z[1] = f24_take(b, 4, 6, 2);
}

template <>
struct Fixed24<Q2_KBlock> {  // [scales 16][qs 64][d][dmin]: w = d sc_g q - dmin m_g, 16-value groups g
  static constexpr bool PAIR = false;
  static constexpr const int32_t (*IDX)[16] = F24_Q6_IDX;
  static void scales(const uint8_t* const* p, __m512* v, __m512* m) { g16_scales_x4<Q2_KBlock>(p, v, m); }
  static void quants(const uint8_t* p, int j, __m512i* q) { k23_low_bits(p + 16 + 32 * j, q); }
};

template <>
struct Fixed24<Q3_KBlock> {  // [hmask 32][qs 64][scales 12][d]: w = d (sc_g - 32) (q - 4), q = 2 bits | hmask bit << 2
  static constexpr bool PAIR = false;
  static constexpr const int32_t (*IDX)[16] = F24_Q6_IDX;
  static void scales(const uint8_t* const* p, __m512* v, __m512* m) {  // v = d (sc - 32), m = -4 v
    // the 12 bytes at 96 as dwords u0 u1 u2 (read from 94, in the block, then moved down 2 bytes): scales 0-3 =
    // u0 & 0x0f.. | (u2 & 0x03..) << 4, 4-7 = u1 & 0x0f.. | (u2 >> 2 & 0x03..) << 4, 8-11 = u0 >> 4 & 0x0f.. |
    // (u2 >> 4 & 0x03..) << 4, 12-15 = u1 >> 4 & 0x0f.. | (u2 >> 6 & 0x03..) << 4 (blocks.h's unpacking)
    const __m512i z = _mm512_bsrli_epi128(g16_bytes_x4(p, 94), 2);
    const __m512i a = _mm512_shuffle_epi32(z, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(1, 0, 1, 0)));  // u0 u1 u0 u1
    const __m512i b = _mm512_shuffle_epi32(z, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(2, 2, 2, 2)));  // u2 x 4
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(a, _mm512_set4_epi32(4, 4, 0, 0)), f24_bytes(0x0f));
    const __m512i high = _mm512_slli_epi32(_mm512_srlv_epi32(b, _mm512_set4_epi32(6, 4, 2, 0)), 4);
    const __m512i sc = _mm512_ternarylogic_epi32(high, f24_bytes(0x30), low, F24_AND_OR);
    g16_times_x4(_mm512_sub_epi8(sc, f24_bytes(32)), p, 108, v);
    for (int r = 0; r < 4; ++r) m[r] = _mm512_mul_ps(v[r], _mm512_set1_ps(-4.0f));
  }
  static void quants(const uint8_t* p, int j, __m512i* q) {
    __m512i z[2];
    k23_low_bits(p + 32 + 32 * j, z);
    // value 128j + 32g + l: bit 4j + g of hmask[l] to bit 2
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const int b = 4 * j;
    q[0] = _mm512_or_si512(z[0], f24_take(h, b, b + 1, 1, 2));
    q[1] = _mm512_or_si512(z[1], f24_take(h, b + 2, b + 3, 1, 2));
  }
};

// y[n .. n + 4) (rows past n_end - 1 repeat the last row and are not written) for one batch row.
template <typename Block, int PLANES>
inline void fixed24_tile(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n, int64_t n_end, int64_t row_bytes) {
  using F = Fixed24<Block>;
  constexpr int NR = 4;
  const auto [dig, xs, xo] = xf.order(F::PAIR);
  const uint8_t* row[NR];
  tile_rows<NR>(w, n, n_end, row_bytes, row);
  __m512 tot[NR][2], off[NR];
  for (int r = 0; r < NR; ++r) tot[r][0] = tot[r][1] = off[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < xf.K / 256; ++i) {
    const uint8_t* blk[NR];
    for (int r = 0; r < NR; ++r) {
      blk[r] = row[r] + i * Block::BYTES;
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk[r] + 2 * NR * row_bytes + o);  // the tile after next
    }
    __m512 sv[NR], mv[NR];
    F::scales(blk, sv, mv);
    const __m512 s = _mm512_load_ps(xs + 16 * i), o = _mm512_load_ps(xo + 16 * i);
    for (int r = 0; r < NR; ++r) off[r] = _mm512_fmadd_ps(mv[r], o, off[r]), sv[r] = _mm512_mul_ps(sv[r], s);
    const int8_t* d = dig + i * 256 * PLANES;
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      for (int r = 0; r < NR; ++r) {
        __m512i q[2];
        F::quants(blk[r], j, q);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const int c = 2 * j + h;
          const __m512i dots = PLANES == 3 ? f24_dot(q[h], d + c * 192)
                                           : _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[h], _mm512_load_si512(d + c * 64));
          const __m512 lanes = _mm512_cvtepi32_ps(dots);
          tot[r][h] = _mm512_fmadd_ps(lanes, _mm512_permutexvar_ps(_mm512_load_si512(F::IDX[c]), sv[r]), tot[r][h]);
        }
      }
    }
  }
  for (int r = 0; r < NR && n + r < n_end; ++r)
    y[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(tot[r][0], tot[r][1]), off[r]));
}

template <typename Block>  // (callers check has_fixed24<Block>())
void fixed24_rows(const Fixed24X& xf, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  fixed24_tiles<Block>(xf, n0, n1, [&](auto p, int64_t n, int64_t rb) { fixed24_tile<Block, p()>(xf, w, y, n, n1, rb); });
}
#elif !defined(SCRATCHLM_FIXED24_AVX2)  // (gemv_fixed24_avx2.h's on AVX2)
template <typename Block>
void fixed24_rows(const Fixed24X&, const uint8_t*, float*, int64_t, int64_t) {}
#endif

}  // namespace scratchlm
