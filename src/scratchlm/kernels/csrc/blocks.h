// ggml's block types, widened exactly to fp32 in registers (simd.h's VF: 16 lanes).
//
// Each type T has QK values per block stored in BYTES bytes (ggml-common.h's block_* structs) and
//   T::chunk(p, c, lo, hi):  values 32c .. 32c + 15 (lo) and 32c + 16 .. 32c + 31 (hi) of the block at p
// equal bit for bit to quant/dequantize.py (and ggml's dequantize_row_*), whose formulas these follow:
// every quant q is a small unsigned integer (exact in fp32), every scale product d * sc is computed in fp32
// exactly as ggml does (an f16 times an integer of at most 8 bits: exact), and then
//   w = fma(q, s, t)     with s, t the sub-block's scale and offset
// which rounds once, like ggml's fl(fl(s q) + t): s q is exact in fp32 (at most 24 significant bits), so
// the fused and the unfused forms agree. For the symmetric types t = -z s (z = 4, 8, 16, 32: a power of two,
// so t is exact) and w = (q - z) s is exact as well. IQ4_NL / IQ4_XS look q up in kvalues (int8 levels) and
// multiply: kvalues[q] * s, exact (at most 7 + 16 significant bits).
// Sub-blocks: Q2_K, Q3_K, Q6_K have 16 of 16 values (lo and hi of chunk c are sub-blocks 2c, 2c + 1);
// Q4_K, Q5_K, IQ4_XS have 8 of 32 (chunk c is sub-block c).

#pragma once

#include <cstdint>
#include <cstring>

#include "simd.h"

namespace scratchlm {

constexpr int64_t QK = 32;           // values per 32-block (and per chunk of every type)
constexpr int64_t QK_K = 256;        // values per K-quant super-block
constexpr int64_t Q8_0_BYTES = 34;   // 2 (d) + 32
constexpr int64_t Q4_1_BYTES = 20;   // 2 (d) + 2 (m) + 16

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// [d f16][32 x int8]: w = d q
struct Q8_0Block {
  static constexpr int64_t QK = 32, BYTES = 34;
  static void chunk(const uint8_t* p, int, VF& lo, VF& hi) {
    const VF d = vset1(fp16_to_f32(p));
    lo = vmul(d, i8_f(load_b16(p + 2)));
    hi = vmul(d, i8_f(load_b16(p + 18)));
  }
};

// [d f16][16 bytes: value j in the low nibble of byte j, value j + 16 in the high nibble]: w = d (q - 8)
struct Q4_0Block {
  static constexpr int64_t QK = 32, BYTES = 18;
  static void chunk(const uint8_t* p, int, VF& lo, VF& hi) {
    const float d = fp16_to_f32(p);
    const VF s = vset1(d), t = vset1(-8.0f * d);
    const B16 q = load_b16(p + 2);
    lo = vfma(nib_lo_f(q), s, t);
    hi = vfma(nib_hi_f(q), s, t);
  }
};

// [d f16][m f16][16 bytes as Q4_0]: w = d q + m
struct Q4_1Block {
  static constexpr int64_t QK = 32, BYTES = 20;
  static void chunk(const uint8_t* p, int, VF& lo, VF& hi) {
    const VF d = vset1(fp16_to_f32(p)), m = vset1(fp16_to_f32(p + 2));
    const B16 q = load_b16(p + 4);
    lo = vfma(d, nib_lo_f(q), m);
    hi = vfma(d, nib_hi_f(q), m);
  }
};

// q = the Q4_0-style nibble | bit j of qh (u32) << 4, for values j = 0..31
inline void q5_values(const uint8_t* qh, const uint8_t* qs, B16& lo, B16& hi) {
  const uint32_t h = load_u32(qh);
  const B16 q = load_b16(qs);
  lo = bor(shr_and(q, 0, 0x0f), bits_as_bytes(h & 0xffffu, 0x10));
  hi = bor(shr_and(q, 4, 0x0f), bits_as_bytes(h >> 16, 0x10));
}

// [d f16][qh u32][16 bytes]: w = d (q - 16)
struct Q5_0Block {
  static constexpr int64_t QK = 32, BYTES = 22;
  static void chunk(const uint8_t* p, int, VF& lo, VF& hi) {
    const float d = fp16_to_f32(p);
    const VF s = vset1(d), t = vset1(-16.0f * d);
    B16 a, b;
    q5_values(p + 2, p + 6, a, b);
    lo = vfma(u8_f(a), s, t);
    hi = vfma(u8_f(b), s, t);
  }
};

// [d f16][m f16][qh u32][16 bytes]: w = d q + m
struct Q5_1Block {
  static constexpr int64_t QK = 32, BYTES = 24;
  static void chunk(const uint8_t* p, int, VF& lo, VF& hi) {
    const VF d = vset1(fp16_to_f32(p)), m = vset1(fp16_to_f32(p + 2));
    B16 a, b;
    q5_values(p + 4, p + 8, a, b);
    lo = vfma(d, u8_f(a), m);
    hi = vfma(d, u8_f(b), m);
  }
};

// [d f16][16 bytes of 4-bit indices as Q4_0]: w = kvalues[q] d
struct IQ4_NLBlock {
  static constexpr int64_t QK = 32, BYTES = 18;
  static void chunk(const uint8_t* p, int, VF& lo, VF& hi) {
    const VF d = vset1(fp16_to_f32(p));
    const B16 q = load_b16(p + 2);
    lo = vmul(iq4_lo_f(q), d);
    hi = vmul(iq4_hi_f(q), d);
  }
};

// [scales 16: scale | min << 4][qs 64][d f16][dmin f16]: w = (d sc) q - (dmin m), 2-bit q: value l of
// group j (32 values) of half h is bits 2j, 2j + 1 of qs[32 h + l]; chunk c = group c % 4 of half c / 4
struct Q2_KBlock {
  static constexpr int64_t QK = 256, BYTES = 84;
  static void chunk(const uint8_t* p, int c, VF& lo, VF& hi) {
    const float d = fp16_to_f32(p + 80), dmin = fp16_to_f32(p + 82);
    const uint8_t* qs = p + 16 + 32 * (c >> 2);
    const int shift = 2 * (c & 3);
    const uint8_t s0 = p[2 * c], s1 = p[2 * c + 1];
    lo = vfma(u8_f(shr_and(load_b16(qs), shift, 3)), vset1(d * static_cast<float>(s0 & 15)),
              vset1(-(dmin * static_cast<float>(s0 >> 4))));
    hi = vfma(u8_f(shr_and(load_b16(qs + 16), shift, 3)), vset1(d * static_cast<float>(s1 & 15)),
              vset1(-(dmin * static_cast<float>(s1 >> 4))));
  }
};

// Q3_K's 6-bit scale s (0..15) of its 12 packed bytes b
inline int q3_k_scale(const uint8_t* b, int s) {
  return ((b[s % 8] >> (4 * (s / 8))) & 15) | (((b[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
}

// [hmask 32][qs 64][scales 12][d f16]: w = (d (sc - 32)) (q - 4), q = the 2-bit q (as Q2_K) | bit c of
// hmask[l] << 2 (hmask's bit set: q - 4 + 4)
struct Q3_KBlock {
  static constexpr int64_t QK = 256, BYTES = 110;
  static void chunk(const uint8_t* p, int c, VF& lo, VF& hi) {
    const float d = fp16_to_f32(p + 108);
    const uint8_t* qs = p + 32 + 32 * (c >> 2);
    const int shift = 2 * (c & 3);
    const float s0 = d * static_cast<float>(q3_k_scale(p + 96, 2 * c) - 32);
    const float s1 = d * static_cast<float>(q3_k_scale(p + 96, 2 * c + 1) - 32);
    const B16 a = bor(shr_and(load_b16(qs), shift, 3), move_bit(load_b16(p), c, 2));
    const B16 b = bor(shr_and(load_b16(qs + 16), shift, 3), move_bit(load_b16(p + 16), c, 2));
    lo = vfma(u8_f(a), vset1(s0), vset1(-4.0f * s0));
    hi = vfma(u8_f(b), vset1(s1), vset1(-4.0f * s1));
  }
};

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4) from their 12 bytes q
inline void k4_scale_min(const uint8_t* q, int j, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// [d f16][dmin f16][scales 12][qs 128]: w = (d sc) q - (dmin m); sub-block c = the low (c even) or high
// nibbles of qs[32 (c / 2) ...]
struct Q4_KBlock {
  static constexpr int64_t QK = 256, BYTES = 144;
  static void chunk(const uint8_t* p, int c, VF& lo, VF& hi) {
    int sc, m;
    k4_scale_min(p + 4, c, sc, m);
    const VF s = vset1(fp16_to_f32(p) * static_cast<float>(sc));
    const VF t = vset1(-(fp16_to_f32(p + 2) * static_cast<float>(m)));
    const uint8_t* qs = p + 16 + 32 * (c >> 1);
    const B16 a = load_b16(qs), b = load_b16(qs + 16);
    lo = vfma(c & 1 ? nib_hi_f(a) : nib_lo_f(a), s, t);
    hi = vfma(c & 1 ? nib_hi_f(b) : nib_lo_f(b), s, t);
  }
};

// [d f16][dmin f16][scales 12][qh 32][qs 128]: as Q4_K with q | (bit c of qh[l]) << 4
struct Q5_KBlock {
  static constexpr int64_t QK = 256, BYTES = 176;
  static void chunk(const uint8_t* p, int c, VF& lo, VF& hi) {
    int sc, m;
    k4_scale_min(p + 4, c, sc, m);
    const VF s = vset1(fp16_to_f32(p) * static_cast<float>(sc));
    const VF t = vset1(-(fp16_to_f32(p + 2) * static_cast<float>(m)));
    const uint8_t* qs = p + 48 + 32 * (c >> 1);
    const int shift = 4 * (c & 1);
    const B16 a = bor(shr_and(load_b16(qs), shift, 0x0f), move_bit(load_b16(p + 16), c, 4));
    const B16 b = bor(shr_and(load_b16(qs + 16), shift, 0x0f), move_bit(load_b16(p + 32), c, 4));
    lo = vfma(u8_f(a), s, t);
    hi = vfma(u8_f(b), s, t);
  }
};

// [ql 128][qh 64][scales 16 x int8][d f16]: w = (d sc) (q - 32); in half h (128 values) group g (32 values):
// q = nibble g / 2 of ql[64 h + 32 (g % 2) + l] | bits 2g, 2g + 1 of qh[32 h + l] << 4
struct Q6_KBlock {
  static constexpr int64_t QK = 256, BYTES = 210;
  static void chunk(const uint8_t* p, int c, VF& lo, VF& hi) {
    const float d = fp16_to_f32(p + 208);
    const int h = c >> 2, g = c & 3;
    const uint8_t* ql = p + 64 * h + 32 * (g & 1);
    const uint8_t* qh = p + 128 + 32 * h;
    const int shift = 4 * (g >> 1);
    const B16 a = bor(shr_and(load_b16(ql), shift, 0x0f), move_2bits(load_b16(qh), 2 * g, 4));
    const B16 b = bor(shr_and(load_b16(ql + 16), shift, 0x0f), move_2bits(load_b16(qh + 16), 2 * g, 4));
    const float s0 = d * static_cast<float>(static_cast<int8_t>(p[192 + 2 * c]));
    const float s1 = d * static_cast<float>(static_cast<int8_t>(p[193 + 2 * c]));
    lo = vfma(u8_f(a), vset1(s0), vset1(-32.0f * s0));
    hi = vfma(u8_f(b), vset1(s1), vset1(-32.0f * s1));
  }
};

// [d f16][scales_h u16][scales_l 4][qs 128]: w = (d (ls - 32)) kvalues[q]; sub-block c's 6-bit ls = nibble
// c % 2 of scales_l[c / 2] | bits 2c, 2c + 1 of scales_h << 4; its 32 indices in qs[16 c ...] as IQ4_NL
struct IQ4_XSBlock {
  static constexpr int64_t QK = 256, BYTES = 136;
  static void chunk(const uint8_t* p, int c, VF& lo, VF& hi) {
    const uint32_t sh = static_cast<uint32_t>(p[2]) | (static_cast<uint32_t>(p[3]) << 8);
    const int ls = ((p[4 + c / 2] >> (4 * (c % 2))) & 15) | (((sh >> (2 * c)) & 3) << 4);
    const VF s = vset1(fp16_to_f32(p) * static_cast<float>(ls - 32));
    const B16 q = load_b16(p + 8 + 16 * c);
    lo = vmul(iq4_lo_f(q), s);
    hi = vmul(iq4_hi_f(q), s);
  }
};

}  // namespace scratchlm
