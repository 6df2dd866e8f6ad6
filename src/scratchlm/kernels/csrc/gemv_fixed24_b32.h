// One batch row (decoding) of y = x @ W^T on the 32-value block types Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL and on
// IQ4_XS (32-value sub-blocks) with AVX512-VNNI, VBMI and BITALG: gemv_fixed24.h's method (x as 24-bit fixed point per
// 32 values, X = rne(x 2^k), three int8 digits; every product and sum exact in integers, fp32 only after) on blocks
// whose scale covers 32 values.
//
// A block holds w = d (q - c) (Q4_0: c = 8, Q5_0: c = 16) or w = d q + m (Q4_1, Q5_1), q unsigned (0..15 / 31), so
//   x~ . W[n] = sum over blocks b ( d_b 2^-k_b * sum_i (q_i - c) X_i  +  m_b 2^-k_b * sum_i X_i )
// Four blocks (128 values) are one step: their 16-byte quant arrays as one register (vpermt2b from two loads that
// end at the last block's end), low nibbles (values 0-15 of each block) and high nibbles (16-31) as two registers
// of unsigned bytes; Q5's fifth bit from qh through 64-bit byte masks (vpshufbitqmb; one masked add of 16 each).
// Int32 lane l then sums 8 products of block l / 4 (4 low, 4 high), per digit plane one vpdpbusd per register:
//   V = ((q.a2) 256 + q.a1) 256 + q.a0  over the lane's 8 values,  |V| <= 8 * 31 * 2^23 < 2^31 at every step
// and c sum X over the same 8 values is subtracted exactly (x's lane sums, prepared once per call). Each lane is
// converted to fp32 (one rounding), multiplied by d_b 2^-k_b (exact) and summed in fp32; the m terms use
// 2^-k_b sum X per lane (one rounding). So y = F.linear(x~, dequantized W) up to fp32 rounding, x~ as gemv_fixed24.h
// rounds it (tests/kernels/test_fixed24.py checks every type against float64).
// IQ4_NL / IQ4_XS: w = s kvalues[q], the values int8 (-127..113): as unsigned bytes v = kvalues[q] + 128 (vpshufb),
// and 8 v a over 24-bit X would overflow int32, so the three digit planes stay apart: per plane
//   V_p = sum v a_p - 128 sum a_p = sum kvalues[q] a_p   (|V_p| <= 8 * 127 * 128, exact; x's plane sums prepared)
// then (V_2 256 + V_1) 256 + V_0 in fp32 (two FMAs, each rounding once) times s 2^-k.
//
// IQ4_XS: a step is half a super-block (its 64 bytes of qs need no gather); the 8 sub-block scales d (ls - 32) are
// unpacked once per super-block and row (iq4_xs_scales), one permute spreads a step's 4 over its lanes.
//
// Why: gemv.h widens each value to fp32 (about 5 vector ops per 16 weights); on Zen 4 that reads Q4_0 at ~8 GB/s
// per core. Here per 128 weights: six vpdpbusd, two shifts, one subtraction, one conversion, one multiply and one
// FMA, the two permutes that gather the quants and the fp16 scales, and the nibbles' and / shift. Two threads,
// streaming (benchmarks/gemv_types.py, Zen 4): Q4_0 ~14 -> 18-22 GB/s, IQ4_XS 9 -> 19, IQ4_NL 14 -> 17.

#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "blocks.h"
#include "gemv_a8_blocks.h"
#include "gemv_fixed24.h"
#include "simd.h"

namespace scratchlm {

#if defined(SCRATCHLM_FIXED24) && defined(__AVX512VBMI__) && defined(__AVX512BITALG__)
#define SCRATCHLM_FIXED24_B32 1
#endif

template <typename Block>
constexpr bool has_fixed24_b32() {
#if defined(SCRATCHLM_FIXED24_B32)
  return std::is_same_v<Block, Q4_0Block> || std::is_same_v<Block, Q4_1Block> || std::is_same_v<Block, Q5_0Block> ||
         std::is_same_v<Block, Q5_1Block> || std::is_same_v<Block, IQ4_NLBlock> || std::is_same_v<Block, IQ4_XSBlock>;
#elif defined(SCRATCHLM_FIXED24_AVX2)  // gemv_fixed24_b32_avx2.h (IQ4's int8 values would saturate vpmaddubsw)
  return std::is_same_v<Block, Q4_0Block> || std::is_same_v<Block, Q4_1Block> || std::is_same_v<Block, Q5_0Block> ||
         std::is_same_v<Block, Q5_1Block>;
#else
  return false;
#endif
}

// x of one batch row rounded as gemv_fixed24.h does, in the order of this kernel's steps. Per step g (4 blocks,
// 128 values; a last step of fewer blocks is zero past K), STEP_BYTES at g * STEP_BYTES:
//   digits [plane a2, a1, a0][half: values 0-15 / 16-31 of each block]: 64 bytes, byte 16 j + i of half h is
//          value 32 j + 16 h + i of the step's block j
//   s  (16 floats, at S_AT): 2^-k of lane l's block (l / 4)
//   o  (16 floats, O_AT): 2^-k sum X over lane l's 8 values (4 (l % 4) .. + 3 of both halves)
//   c8, c16 (16 int32, C8_AT / C16_AT): 8 and 16 times sum X over the same values
//   p2, p1, p0 (16 int32 each, P_AT): 128 times the sum of the digits a2 / a1 / a0 over the same values (IQ4)
struct Fixed24X32 {
  static constexpr int64_t S_AT = 384, O_AT = 448, C8_AT = 512, C16_AT = 576, P_AT = 640, STEP_BYTES = 832;
  std::vector<int8_t> buf;
  int8_t* base = nullptr;
  int64_t K = 0;
  int planes = 3;  // digits per value: 3 (24-bit X), or 1 (prepare_q8: the A8 rounding's int8 q, in a2's place)

  Fixed24X32() = default;
  Fixed24X32(const Fixed24X32&) = delete;
  Fixed24X32& operator=(const Fixed24X32&) = delete;

  int64_t steps() const { return (K / 32 + 3) / 4; }
  const int8_t* step(int64_t g) const { return base + g * STEP_BYTES; }

#if defined(SCRATCHLM_FIXED24_B32)
  void layout(int64_t K_, int planes_) {
    K = K_, planes = planes_;
    buf.assign(steps() * STEP_BYTES + 64, 0);
    base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  }

  // One row rounded the A8 way (gemv_a8_blocks.h's ActRows, per 32 or 256 values): one digit plane (q), 2^-k
  // replaced by the block's d, the sums by those of q. The kernel then computes round(x) W^T, the A8 row formats'
  // definition, with two vpdpbusd per 128 weights.
  void prepare_q8(const ActRows& a) {
    layout(a.K, 1);
    for (int64_t b = 0; b < K / 32; ++b) {
      int8_t* st = base + (b / 4) * STEP_BYTES;
      const int j = static_cast<int>(b % 4);
      const int8_t* q = a.q.data() + 32 * b;
      std::memcpy(st + 16 * j, q, 16);
      std::memcpy(st + 64 + 16 * j, q + 16, 16);
      const float d = a.d[32 * b / a.qk];
      for (int t = 0; t < 4; ++t) {
        int32_t sum = 0;
        for (int i = 0; i < 4; ++i) sum += q[4 * t + i] + q[16 + 4 * t + i];
        const int l = 4 * j + t;
        reinterpret_cast<float*>(st + S_AT)[l] = d, reinterpret_cast<float*>(st + O_AT)[l] = d * static_cast<float>(sum);
        reinterpret_cast<int32_t*>(st + C8_AT)[l] = 8 * sum, reinterpret_cast<int32_t*>(st + C16_AT)[l] = 16 * sum;
        reinterpret_cast<int32_t*>(st + P_AT)[l] = 128 * sum;
      }
    }
  }

  // x: K values, K a multiple of 32.
  void prepare(const float* x, int64_t K_) {
    layout(K_, 3);
    for (int64_t b = 0; b < K / 32; ++b) {
      int8_t* st = base + (b / 4) * STEP_BYTES;
      const int j = static_cast<int>(b % 4);
      __m512i X[2];
      const float xsc = fixed24_round32(x + 32 * b, X);
      alignas(64) int32_t v[16], pd[3][2][16];  // X of both halves added; each plane's digits as int32
      for (int h = 0; h < 2; ++h) {
        __m128i d[3];
        fixed24_digits(X[h], d);
        for (int plane = 0; plane < 3; ++plane) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(st + (2 * plane + h) * 64 + 16 * j), d[plane]);
          _mm512_store_si512(pd[plane][h], _mm512_cvtepi8_epi32(d[plane]));
        }
      }
      // lane sums: values 4 t .. 4 t + 3 of both halves, t = 0..3 (|sum| <= 8 * 2^23: exact)
      _mm512_store_si512(v, _mm512_add_epi32(X[0], X[1]));
      float* s = reinterpret_cast<float*>(st + S_AT);
      float* o = reinterpret_cast<float*>(st + O_AT);
      int32_t* c8 = reinterpret_cast<int32_t*>(st + C8_AT);
      int32_t* c16 = reinterpret_cast<int32_t*>(st + C16_AT);
      for (int t = 0; t < 4; ++t) {
        const int32_t sum = v[4 * t] + v[4 * t + 1] + v[4 * t + 2] + v[4 * t + 3];
        const int l = 4 * j + t;
        s[l] = xsc, o[l] = xsc * static_cast<float>(sum), c8[l] = 8 * sum, c16[l] = 16 * sum;
        for (int plane = 0; plane < 3; ++plane) {
          int32_t ps = 0;
          for (int h = 0; h < 2; ++h) ps += pd[plane][h][4 * t] + pd[plane][h][4 * t + 1] + pd[plane][h][4 * t + 2] + pd[plane][h][4 * t + 3];
          reinterpret_cast<int32_t*>(st + P_AT + 64 * plane)[l] = 128 * ps;
        }
      }
    }
  }
#elif defined(SCRATCHLM_FIXED24_AVX2)
  // AVX2 (gemv_fixed24_b32_avx2.h): one 32-value block per step of A_BYTES: digit planes a2, a1, a0 (32 bytes each,
  // the block's values in order; prepare_q8: q in a2's place), at A_C8 / A_C16 8 and 16 times the sum of X over each
  // int32 lane's 4 values (8 int32 each); apart, per block b: xs[b] its 2^-k, xo[b] 2^-k sum X (zero past the last
  // block, to a multiple of 8).
  static constexpr int64_t A_C8 = 96, A_C16 = 128, A_BYTES = 160;
  std::vector<float> xs, xo;
  const int8_t* block(int64_t b) const { return base + b * A_BYTES; }

  void layout(int64_t K_, int planes_) {
    K = K_, planes = planes_;
    buf.assign(K / 32 * A_BYTES + 64, 0);
    base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
    xs.assign((K / 32 + 7) / 8 * 8, 0.0f), xo.assign(xs.size(), 0.0f);
  }
  // block b's sums and scale from its 32 X (or q) values
  void store_block(int64_t b, const int32_t* X, float xsc) {
    int8_t* st = base + b * A_BYTES;
    int32_t total = 0;
    for (int l = 0; l < 8; ++l) {
      const int32_t sum = X[4 * l] + X[4 * l + 1] + X[4 * l + 2] + X[4 * l + 3];  // |sum| <= 4 * 2^23: exact
      reinterpret_cast<int32_t*>(st + A_C8)[l] = 8 * sum, reinterpret_cast<int32_t*>(st + A_C16)[l] = 16 * sum;
      total += sum;
    }
    xs[b] = xsc, xo[b] = xsc * static_cast<float>(total);
  }
  void prepare_q8(const ActRows& a) {
    layout(a.K, 1);
    for (int64_t b = 0; b < K / 32; ++b) {
      const int8_t* q = a.q.data() + 32 * b;
      std::memcpy(base + b * A_BYTES, q, 32);
      int32_t X[32];
      for (int l = 0; l < 32; ++l) X[l] = q[l];
      store_block(b, X, a.d[32 * b / a.qk]);
    }
  }
  // x: K values, K a multiple of 32; rounded per 32 values as gemv_fixed24.h's AVX-512 form (its 2^-k meets each
  // block's own scale d before any sum across blocks)
  void prepare(const float* x, int64_t K_) {
    layout(K_, 3);
    for (int64_t b = 0; b < K / 32; ++b) {
      int32_t X[32];
      const float xsc = fixed24_round_avx2(x + 32 * b, 32, X);
      int8_t* st = base + b * A_BYTES;
      for (int l = 0; l < 32; ++l) {
        const std::array<int8_t, 3> d = fixed24_split(X[l]);
        for (int plane = 0; plane < 3; ++plane) st[32 * plane + l] = d[plane];
      }
      store_block(b, X, xsc);
    }
  }
#else
  void prepare(const float*, int64_t K_) { K = K_; }
  void prepare_q8(const ActRows& a) { K = a.K, planes = 1; }
#endif
};

#if defined(SCRATCHLM_FIXED24_B32)
// Per type: the block's byte layout (blocks.h: quants at QS, Q5's qh at QH) and its offset c (0 with M: w = d q + m,
// the m at byte 2).
template <typename Block>
struct Fixed24B32;
// KV: the quants index kvalues (IQ4); XS: IQ4_XS's 256-value super-blocks (no gather: a step is 64 bytes of qs).
template <>
struct Fixed24B32<Q4_0Block> {
  static constexpr int QS = 2, QH = -1, C = 8;
  static constexpr bool M = false, KV = false, XS = false;
};
template <>
struct Fixed24B32<Q4_1Block> {
  static constexpr int QS = 4, QH = -1, C = 0;
  static constexpr bool M = true, KV = false, XS = false;
};
template <>
struct Fixed24B32<Q5_0Block> {
  static constexpr int QS = 6, QH = 2, C = 16;
  static constexpr bool M = false, KV = false, XS = false;
};
template <>
struct Fixed24B32<Q5_1Block> {
  static constexpr int QS = 8, QH = 4, C = 0;
  static constexpr bool M = true, KV = false, XS = false;
};
template <>
struct Fixed24B32<IQ4_NLBlock> {
  static constexpr int QS = 2, QH = -1, C = 0;
  static constexpr bool M = false, KV = true, XS = false;
};
template <>
struct Fixed24B32<IQ4_XSBlock> {
  static constexpr int QS = 8, QH = -1, C = 0;
  static constexpr bool M = false, KV = true, XS = true;
};

// Index tables for a step's two loads, lo = p[0, 64) and hi = p[4 S - 64, 4 S) (S = Block::BYTES): byte / word i of
// the pair is lo's for i < 64 (words: 32), else hi's i - 64 (i - 32); the offset o of the step reads from lo when
// o < 64, else from hi at o - (4 S - 64).
template <typename Block>
struct Fixed24B32Index {
  alignas(64) uint8_t qs[64];   // byte 16 j + i: quant byte i of block j
  alignas(64) uint16_t dm[32];  // word l (< 16): d of block l / 4; word 16 + l: m of block l / 4 (M types)
  alignas(64) uint8_t qh[64];   // Q5: bytes 16 j + 8 h + t (t < 4): qh byte t of block j (qwords 2 j, 2 j + 1)
  constexpr Fixed24B32Index() : qs(), dm(), qh() {
    constexpr int S = static_cast<int>(Block::BYTES), HI = 4 * S - 64;
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 16; ++i) {
        const int o = S * j + Fixed24B32<Block>::QS + i;
        qs[16 * j + i] = static_cast<uint8_t>(o < 64 ? o : 64 + o - HI);
      }
    for (int l = 0; l < 32; ++l) {
      const int o = S * ((l % 16) / 4) + (l < 16 ? 0 : 2);  // bytes, even
      dm[l] = static_cast<uint16_t>(o < 64 ? o / 2 : 32 + (o - HI) / 2);
    }
    if constexpr (Fixed24B32<Block>::QH >= 0)
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 8; ++t) {
          const int o = S * j + Fixed24B32<Block>::QH + t % 4;
          qh[16 * j + t] = qh[16 * j + 8 + t] = static_cast<uint8_t>(o < 64 ? o : 64 + o - HI);
        }
  }
};
template <typename Block>
inline constexpr Fixed24B32Index<Block> F24_B32_INDEX{};

// Q5: bit 16 j + i of the masks lo / hi is bit i / 16 + i of block j's qh (qh: each block's qh in its two qwords):
// vpshufbitqmb picks, for byte b of the result, bit sel[b] of b's qword.
inline void q5_high_masks(__m512i qh, __mmask64& lo, __mmask64& hi) {
  const __m512i sel = _mm512_set_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7,
                                      6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13,
                                      12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  lo = _mm512_bitshuffle_epi64_mask(qh, sel);
  hi = _mm512_bitshuffle_epi64_mask(qh, _mm512_add_epi8(sel, _mm512_set1_epi8(16)));
}

// kvalues + 128 as unsigned bytes, in each 128-bit lane (vpermb's table: index bits 4-5 pick a copy)
inline __m512i iq4_table() {
  const __m128i kv = _mm_load_si128(reinterpret_cast<const __m128i*>(KVALUES_IQ4NL));
  return _mm512_broadcast_i32x4(_mm_xor_si128(kv, _mm_set1_epi8(static_cast<char>(0x80))));
}

// The int32 lanes of one step: sum over each lane's 8 values of q a (plane order a2, a1, a0: digits[0..5] = a2 low,
// a2 high, a1 low, ...) combined as ((. 256) + .) 256 + . in integers, minus c (the header); PLANES 1: q a2 only.
template <int PLANES>
inline __m512 b32_lanes(__m512i ql, __m512i qh, const __m512i* a, __m512i c, bool sub) {
  __m512i v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ql, a[0]), qh, a[1]);
  if constexpr (PLANES == 3) {
    v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(v, 8), ql, a[2]), qh, a[3]);
    v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(v, 8), ql, a[4]), qh, a[5]);
  }
  return _mm512_cvtepi32_ps(sub ? _mm512_sub_epi32(v, c) : v);
}

// The IQ4 types' lanes: ql / qh as kvalues + 128, each plane apart (p: x's 128-times plane sums), fp32 after.
template <int PLANES>
inline __m512 b32_kv_lanes(__m512i ql, __m512i qh, const __m512i* a, const int8_t* p) {
  __m512 t = _mm512_setzero_ps();
  const __m512 base = _mm512_set1_ps(256.0f);
  for (int plane = 0; plane < PLANES; ++plane) {
    const __m512i v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ql, a[2 * plane]), qh, a[2 * plane + 1]);
    const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_load_si512(p + 64 * plane)));
    t = plane == 0 ? f : _mm512_fmadd_ps(t, base, f);
  }
  return t;
}

// IQ4_XS: the 8 sub-block scales d (ls - 32) of the block at p in lanes 0-7 (blocks.h's IQ4_XSBlock::prepare, as
// vector shifts: ls_j = nibble j of scales_l | bits 2j, 2j + 1 of scales_h << 4)
inline __m512 iq4_xs_scales(const uint8_t* p) {
  uint32_t lo;
  uint16_t hi;
  std::memcpy(&lo, p + 4, 4);
  std::memcpy(&hi, p + 2, 2);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i l = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(lo)), shifts), _mm256_set1_epi32(15));
  const __m256i h = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(hi << 4), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                     _mm256_set1_epi32(0x30));
  const __m256 ls = _mm256_cvtepi32_ps(_mm256_or_si256(l, h));
  return _mm512_castps256_ps512(_mm256_mul_ps(_mm256_sub_ps(ls, _mm256_set1_ps(32.0f)), _mm256_set1_ps(fp16_to_f32(p))));
}

// y[n .. n + 4) (rows past n_end - 1 repeat the last row and are not written) for one batch row.
template <typename Block, int PLANES>
inline void fixed24_b32_tile(const Fixed24X32& xf, const uint8_t* w, float* y, int64_t n, int64_t n_end,
                             int64_t row_bytes) {
  using F = Fixed24B32<Block>;
  constexpr int NR = 4;
  constexpr int64_t S = Block::BYTES, HI = 4 * S - 64;
  const __m512i nib = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(0x10);
  __m512i qs_idx = nib, dm_idx = nib, qh_idx = nib, table = nib;
  if constexpr (!F::XS) {
    const Fixed24B32Index<Block>& ix = F24_B32_INDEX<Block>;
    qs_idx = _mm512_load_si512(ix.qs), dm_idx = _mm512_load_si512(ix.dm), qh_idx = _mm512_load_si512(ix.qh);
  }
  if constexpr (F::KV) table = iq4_table();
  const uint8_t* row[NR];
  for (int r = 0; r < NR; ++r) row[r] = w + std::min(n + r, n_end - 1) * row_bytes;
  __m512 tot[NR], off[NR], xs_sc[NR];  // xs_sc: IQ4_XS, the super-block's 8 sub-block scales (even lanes)
  for (int r = 0; r < NR; ++r) tot[r] = off[r] = xs_sc[r] = _mm512_setzero_ps();
  const int64_t nblocks = xf.K / 32;
  // step g of every row; tail: the rows' last step, of nb < 4 blocks (no byte read past a row's end)
  auto step = [&](int64_t g, auto tail) {
    constexpr bool TAIL = decltype(tail)::value;
    const int64_t len = (nblocks - 4 * g) * S;  // TAIL: the bytes left in each row
    const int8_t* st = xf.step(g);
    __m512i a[2 * PLANES];
    for (int i = 0; i < 2 * PLANES; ++i) a[i] = _mm512_load_si512(st + 64 * i);
    const __m512 s = _mm512_load_ps(reinterpret_cast<const float*>(st + Fixed24X32::S_AT));
    const __m512i c = _mm512_load_si512(st + (F::C == 16 ? Fixed24X32::C16_AT : Fixed24X32::C8_AT));
    for (int r = 0; r < NR; ++r) {
      __m512i qs;
      __m512 d, m = s;
      __mmask64 ml = 0, mh = 0;  // Q5: the fifth bits
      if constexpr (F::XS) {  // super-block g / 2, its sub-blocks 4 (g % 2) .. + 3
        const uint8_t* p = row[r] + (g / 2) * S;
        if (g % 2 == 0) {
          for (int64_t o = 0; o < S; o += 64) prefetch(p + 2 * NR * row_bytes + o);  // the tile after next
          xs_sc[r] = iq4_xs_scales(p);
        }
        const int j = 4 * static_cast<int>(g % 2);
        d = _mm512_permutexvar_ps(_mm512_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1, j + 2, j + 2, j + 2, j + 2, j + 3,
                                                    j + 3, j + 3, j + 3), xs_sc[r]);
        qs = _mm512_loadu_si512(p + 8 + 64 * (g % 2));
      } else {
        const uint8_t* p = row[r] + 4 * S * g;
        for (int64_t o = 0; o < 4 * S; o += 64) prefetch(p + 2 * NR * row_bytes + o);  // the tile after next
        __m512i lo, hi;
        if constexpr (!TAIL) {
          lo = _mm512_loadu_si512(p), hi = _mm512_loadu_si512(p + HI);
        } else {
          lo = _mm512_maskz_loadu_epi8(len >= 64 ? ~0ull : (1ull << len) - 1, p);
          hi = len > HI ? _mm512_maskz_loadu_epi8(~0ull >> (64 - (len - HI)), p + HI) : _mm512_setzero_si512();
        }
        qs = _mm512_permutex2var_epi8(lo, qs_idx, hi);
        const __m512i dm = _mm512_permutex2var_epi16(lo, dm_idx, hi);
        d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
        if constexpr (F::M) m = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1));
        if constexpr (F::QH >= 0) q5_high_masks(_mm512_permutex2var_epi8(lo, qh_idx, hi), ml, mh);
      }
      __m512 lanes;
      if constexpr (F::KV) {
        // vpermb reads 6 index bits and the table repeats every 16 bytes: the nibbles need no masks
        lanes = b32_kv_lanes<PLANES>(_mm512_permutexvar_epi8(qs, table), _mm512_permutexvar_epi8(_mm512_srli_epi16(qs, 4), table),
                                     a, st + Fixed24X32::P_AT);
      } else {
        __m512i ql = _mm512_and_si512(qs, nib), qh = f24_take(qs, 4, 4, 4);
        if constexpr (F::QH >= 0)
          ql = _mm512_mask_add_epi8(ql, ml, ql, sixteen), qh = _mm512_mask_add_epi8(qh, mh, qh, sixteen);
        lanes = b32_lanes<PLANES>(ql, qh, a, c, F::C != 0);
      }
      tot[r] = _mm512_fmadd_ps(lanes, _mm512_mul_ps(d, s), tot[r]);
      if constexpr (F::M)
        off[r] = _mm512_fmadd_ps(m, _mm512_load_ps(reinterpret_cast<const float*>(st + Fixed24X32::O_AT)), off[r]);
    }
  };
  const int64_t full = nblocks / 4;
  for (int64_t g = 0; g < full; ++g) step(g, std::false_type{});
  if (nblocks % 4) step(full, std::true_type{});
  for (int r = 0; r < NR && n + r < n_end; ++r) y[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(tot[r], off[r]));
}

template <typename Block>  // (callers check has_fixed24_b32<Block>())
void fixed24_b32_rows(const Fixed24X32& xf, const uint8_t* w, float* y, int64_t n0, int64_t n1) {
  fixed24_tiles<Block>(xf, n0, n1, [&](auto p, int64_t n, int64_t rb) { fixed24_b32_tile<Block, p()>(xf, w, y, n, n1, rb); });
}
#elif !defined(SCRATCHLM_FIXED24_AVX2)  // (gemv_fixed24_b32_avx2.h's on AVX2)
template <typename Block>
void fixed24_b32_rows(const Fixed24X32&, const uint8_t*, float*, int64_t, int64_t) {}
#endif

}  // namespace scratchlm
