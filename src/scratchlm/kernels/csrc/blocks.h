// ggml's block types, widened exactly to fp32 in registers (simd.h's VF: 16 lanes).
//
// Each type T has QK values per block stored in BYTES bytes (ggml-common.h's block_* structs) and
//   T::prepare(p, sc):           the block's scales and offsets as fp32 (once per block): sc[g] the scale and
//                                sc[16 + g] the offset of its 16-value group g (offset 0 where it has none)
//   T::chunk_scales(p, sc):      where a type has it, the scales chunk reads instead (Q4_K / Q5_K: sc[c], sc[8 + c]
//                                for sub-block c, not copied per group); chunk_scales() below picks
//   T::chunk(p, sc, c, lo, hi):  values 32c .. 32c + 15 (lo) and 32c + 16 .. 32c + 31 (hi) of the block at p
//   T::quants(p, c, lo, hi):     the same values' integer quants q (w = s q + t), 16 bytes each: unsigned,
//                                or int8 where T::SIGNED (Q8_0's q, IQ4's kvalues[q]); for the A8 kernels
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
#include <type_traits>

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

// A 32-block's scale d and offset t for both its 16-value groups (blocks.h's sc layout)
inline void block32_scales(float* sc, float d, float t) { sc[0] = sc[1] = d, sc[16] = sc[17] = t; }

// 16 bytes -> their low nibbles (lo) and high nibbles (hi)
inline void nibbles(B16 q, B16& lo, B16& hi) { lo = shr_and(q, 0, 0x0f), hi = shr_and(q, 4, 0x0f); }

// IQ4 indices in nibbles -> their int8 levels kvalues[q]
inline void iq4_values(B16 q, B16& lo, B16& hi) {
  lo = lookup_iq4(shr_and(q, 0, 0x0f)), hi = lookup_iq4(shr_and(q, 4, 0x0f));
}

// [d f16][32 x int8]: w = d q
struct Q8_0Block {
  static constexpr int64_t QK = 32, BYTES = 34;
  static constexpr bool SIGNED = true;
  static void prepare(const uint8_t* p, float* sc) { block32_scales(sc, fp16_to_f32(p), 0.f); }
  static void chunk(const uint8_t* p, const float* sc, int, VF& lo, VF& hi) {
    const VF d = vset1(sc[0]);
    lo = vmul(d, i8_f(load_b16(p + 2)));
    hi = vmul(d, i8_f(load_b16(p + 18)));
  }
  static void quants(const uint8_t* p, int, B16& lo, B16& hi) { lo = load_b16(p + 2), hi = load_b16(p + 18); }
};

// [d f16][16 bytes: value j in the low nibble of byte j, value j + 16 in the high nibble]: w = d (q - 8)
struct Q4_0Block {
  static constexpr int64_t QK = 32, BYTES = 18;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) { block32_scales(sc, fp16_to_f32(p), -8.0f * fp16_to_f32(p)); }
  static void chunk(const uint8_t* p, const float* sc, int, VF& lo, VF& hi) {
    const VF s = vset1(sc[0]), t = vset1(sc[16]);
    const B16 q = load_b16(p + 2);
    lo = vfma(nib_lo_f(q), s, t);
    hi = vfma(nib_hi_f(q), s, t);
  }
  static void quants(const uint8_t* p, int, B16& lo, B16& hi) { nibbles(load_b16(p + 2), lo, hi); }
};

// [d f16][m f16][16 bytes as Q4_0]: w = d q + m
struct Q4_1Block {
  static constexpr int64_t QK = 32, BYTES = 20;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) { block32_scales(sc, fp16_to_f32(p), fp16_to_f32(p + 2)); }
  static void chunk(const uint8_t* p, const float* sc, int, VF& lo, VF& hi) {
    const VF d = vset1(sc[0]), m = vset1(sc[16]);
    const B16 q = load_b16(p + 4);
    lo = vfma(d, nib_lo_f(q), m);
    hi = vfma(d, nib_hi_f(q), m);
  }
  static void quants(const uint8_t* p, int, B16& lo, B16& hi) { nibbles(load_b16(p + 4), lo, hi); }
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
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) { block32_scales(sc, fp16_to_f32(p), -16.0f * fp16_to_f32(p)); }
  static void chunk(const uint8_t* p, const float* sc, int, VF& lo, VF& hi) {
    const VF s = vset1(sc[0]), t = vset1(sc[16]);
    B16 a, b;
    q5_values(p + 2, p + 6, a, b);
    lo = vfma(u8_f(a), s, t);
    hi = vfma(u8_f(b), s, t);
  }
  static void quants(const uint8_t* p, int, B16& lo, B16& hi) { q5_values(p + 2, p + 6, lo, hi); }
};

// [d f16][m f16][qh u32][16 bytes]: w = d q + m
struct Q5_1Block {
  static constexpr int64_t QK = 32, BYTES = 24;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) { block32_scales(sc, fp16_to_f32(p), fp16_to_f32(p + 2)); }
  static void chunk(const uint8_t* p, const float* sc, int, VF& lo, VF& hi) {
    const VF d = vset1(sc[0]), m = vset1(sc[16]);
    B16 a, b;
    q5_values(p + 4, p + 8, a, b);
    lo = vfma(d, u8_f(a), m);
    hi = vfma(d, u8_f(b), m);
  }
  static void quants(const uint8_t* p, int, B16& lo, B16& hi) { q5_values(p + 4, p + 8, lo, hi); }
};

// [d f16][16 bytes of 4-bit indices as Q4_0]: w = kvalues[q] d
struct IQ4_NLBlock {
  static constexpr int64_t QK = 32, BYTES = 18;
  static constexpr bool SIGNED = true;
  static void prepare(const uint8_t* p, float* sc) { block32_scales(sc, fp16_to_f32(p), 0.f); }
  static void chunk(const uint8_t* p, const float* sc, int, VF& lo, VF& hi) {
    const VF d = vset1(sc[0]);
    const B16 q = load_b16(p + 2);
    lo = vmul(iq4_lo_f(q), d);
    hi = vmul(iq4_hi_f(q), d);
  }
  static void quants(const uint8_t* p, int, B16& lo, B16& hi) { iq4_values(load_b16(p + 2), lo, hi); }
};

// The K-quants' chunk c: w = fma(q, s, t) for lo (s = sc[i], t = sc[16 + i]) and hi (i + 1)
inline void k_chunk(B16 a, B16 b, const float* sc, int i, VF& lo, VF& hi) {
  lo = vfma(u8_f(a), vset1(sc[i]), vset1(sc[16 + i]));
  hi = vfma(u8_f(b), vset1(sc[i + 1]), vset1(sc[17 + i]));
}

// [scales 16: scale | min << 4][qs 64][d f16][dmin f16]: w = (d sc) q - (dmin m), 2-bit q: value l of
// group j (32 values) of half h is bits 2j, 2j + 1 of qs[32 h + l]; chunk c = group c % 4 of half c / 4.
// sc: the 16 scales d sc, then the 16 offsets -(dmin m) = (-dmin) m
struct Q2_KBlock {
  static constexpr int64_t QK = 256, BYTES = 84;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) {
    const B16 b = load_b16(p);
    vstore(sc, vmul(nib_lo_f(b), vset1(fp16_to_f32(p + 80))));
    vstore(sc + 16, vmul(nib_hi_f(b), vset1(-fp16_to_f32(p + 82))));
  }
  static void quants(const uint8_t* p, int c, B16& lo, B16& hi) {
    const uint8_t* qs = p + 16 + 32 * (c >> 2);
    const int shift = 2 * (c & 3);
    lo = shr_and(load_b16(qs), shift, 3), hi = shr_and(load_b16(qs + 16), shift, 3);
  }
  static void chunk(const uint8_t* p, const float* sc, int c, VF& lo, VF& hi) {
    B16 a, b;
    quants(p, c, a, b);
    k_chunk(a, b, sc, 2 * c, lo, hi);
  }
};

// [hmask 32][qs 64][scales 12][d f16]: w = (d (sc - 32)) (q - 4), q = the 2-bit q (as Q2_K) | bit c of
// hmask[l] << 2 (a set hmask bit: q - 4 + 4). sc: the 16 scales d (sc - 32), then the offsets -4 d (sc - 32)
// A Q3_K block's 12 scale bytes (at p) as its 16 six-bit scales, one per byte (ggml's unpacking; out: 16 bytes)
inline void q3k_scales(const uint8_t* p, uint8_t* out) {
  uint32_t aux[4];
  std::memcpy(aux, p, 12);
  const uint32_t m2 = 0x0f0f0f0f, m1 = 0x03030303, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & m2) | (((tmp >> 4) & m1) << 4);
  aux[3] = ((aux[1] >> 4) & m2) | (((tmp >> 6) & m1) << 4);
  aux[0] = (aux[0] & m2) | (((tmp >> 0) & m1) << 4);
  aux[1] = (aux[1] & m2) | (((tmp >> 2) & m1) << 4);
  std::memcpy(out, aux, 16);
}

struct Q3_KBlock {
  static constexpr int64_t QK = 256, BYTES = 110;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) {
    alignas(16) uint8_t six[16];
    q3k_scales(p + 96, six);
    const VF s = vmul(vadd(u8_f(load_b16(six)), vset1(-32.0f)), vset1(fp16_to_f32(p + 108)));
    vstore(sc, s);
    vstore(sc + 16, vmul(s, vset1(-4.0f)));
  }
  static void quants(const uint8_t* p, int c, B16& lo, B16& hi) {
    const uint8_t* qs = p + 32 + 32 * (c >> 2);
    const int shift = 2 * (c & 3);
    lo = bor(shr_and(load_b16(qs), shift, 3), move_bit(load_b16(p), c, 2));
    hi = bor(shr_and(load_b16(qs + 16), shift, 3), move_bit(load_b16(p + 16), c, 2));
  }
  static void chunk(const uint8_t* p, const float* sc, int c, VF& lo, VF& hi) {
    B16 a, b;
    quants(p, c, a, b);
    k_chunk(a, b, sc, 2 * c, lo, hi);
  }
};

// Q4_K / Q5_K: the 8 six-bit scales and 8 mins of the 12 bytes q (ggml's get_scale_min_k4), unpacked as
// ggml's vec_dot does, times d and -dmin: v[j] = d sc_j, v[8 + j] = -(dmin m_j) for sub-block j
// The 16 bytes of u: the 8 six-bit scales, then the 8 mins.
[[gnu::always_inline]] inline void k4_unpack(const uint8_t* p, uint32_t* u) {
  std::memcpy(u, p + 4, 12);
  const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
  u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
  const uint32_t mins_lo = u[1] & m1;
  u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
  u[2] = mins_lo;
  u[0] &= m1;
}

[[gnu::always_inline]] inline void k4_scales8(const uint8_t* p, float* v) {
  uint32_t u[4];
  k4_unpack(p, u);
  vstore(v, vmul(u8_f(load_b16(reinterpret_cast<const uint8_t*>(u))), vset2(fp16_to_f32(p), -fp16_to_f32(p + 2))));
}

// k4_scales8 in blocks.h's sc layout (the A8 kernels'): sub-block j's groups 2j, 2j + 1 get d sc_j and -(dmin m_j)
inline void k4_prepare(const uint8_t* p, float* sc) {
  alignas(64) float v[16];
  k4_scales8(p, v);
  for (int j = 0; j < 8; ++j) sc[2 * j] = sc[2 * j + 1] = v[j], sc[16 + 2 * j] = sc[17 + 2 * j] = v[8 + j];
}

// [d f16][dmin f16][scales 12][qs 128]: w = (d sc) q - (dmin m); sub-block c = the low (c even) or high
// nibbles of qs[32 (c / 2) ...]
struct Q4_KBlock {
  static constexpr int64_t QK = 256, BYTES = 144;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) { k4_prepare(p, sc); }
  static void chunk_scales(const uint8_t* p, float* sc) { k4_scales8(p, sc); }  // chunk's sc: 8 + 8, no copies
  static void quants(const uint8_t* p, int c, B16& lo, B16& hi) {
    const uint8_t* qs = p + 16 + 32 * (c >> 1);
    lo = shr_and(load_b16(qs), 4 * (c & 1), 0x0f), hi = shr_and(load_b16(qs + 16), 4 * (c & 1), 0x0f);
  }
  static void chunk(const uint8_t* p, const float* sc, int c, VF& lo, VF& hi) {
    const uint8_t* qs = p + 16 + 32 * (c >> 1);
    const B16 a = load_b16(qs), b = load_b16(qs + 16);
    const VF s = vset1(sc[c]), t = vset1(sc[8 + c]);
    lo = vfma(c & 1 ? nib_hi_f(a) : nib_lo_f(a), s, t);
    hi = vfma(c & 1 ? nib_hi_f(b) : nib_lo_f(b), s, t);
  }
};

// [d f16][dmin f16][scales 12][qh 32][qs 128]: as Q4_K with q | (bit c of qh[l]) << 4
struct Q5_KBlock {
  static constexpr int64_t QK = 256, BYTES = 176;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) { k4_prepare(p, sc); }
  static void chunk_scales(const uint8_t* p, float* sc) { k4_scales8(p, sc); }  // as Q4_K
  static void quants(const uint8_t* p, int c, B16& lo, B16& hi) {
    const uint8_t* qs = p + 48 + 32 * (c >> 1);
    const int shift = 4 * (c & 1);
    lo = bor(shr_and(load_b16(qs), shift, 0x0f), move_bit(load_b16(p + 16), c, 4));
    hi = bor(shr_and(load_b16(qs + 16), shift, 0x0f), move_bit(load_b16(p + 32), c, 4));
  }
  static void chunk(const uint8_t* p, const float* sc, int c, VF& lo, VF& hi) {
    B16 a, b;
    quants(p, c, a, b);
    const VF s = vset1(sc[c]), t = vset1(sc[8 + c]);
    lo = vfma(u8_f(a), s, t);
    hi = vfma(u8_f(b), s, t);
  }
};

// [ql 128][qh 64][scales 16 x int8][d f16]: w = (d sc) (q - 32); in half h (128 values) group g (32 values):
// q = nibble g / 2 of ql[64 h + 32 (g % 2) + l] | bits 2g, 2g + 1 of qh[32 h + l] << 4.
// sc: the 16 scales d sc, then the offsets -32 d sc
struct Q6_KBlock {
  static constexpr int64_t QK = 256, BYTES = 210;
  static constexpr bool SIGNED = false;
  static void prepare(const uint8_t* p, float* sc) {
    const VF s = vmul(i8_f(load_b16(p + 192)), vset1(fp16_to_f32(p + 208)));
    vstore(sc, s);
    vstore(sc + 16, vmul(s, vset1(-32.0f)));
  }
  static void quants(const uint8_t* p, int c, B16& lo, B16& hi) {
    const int h = c >> 2, g = c & 3;
    const uint8_t* ql = p + 64 * h + 32 * (g & 1);
    const uint8_t* qh = p + 128 + 32 * h;
    const int shift = 4 * (g >> 1);
    lo = bor(shr_and(load_b16(ql), shift, 0x0f), move_2bits(load_b16(qh), 2 * g, 4));
    hi = bor(shr_and(load_b16(ql + 16), shift, 0x0f), move_2bits(load_b16(qh + 16), 2 * g, 4));
  }
  static void chunk(const uint8_t* p, const float* sc, int c, VF& lo, VF& hi) {
    B16 a, b;
    quants(p, c, a, b);
    k_chunk(a, b, sc, 2 * c, lo, hi);
  }
};

// [d f16][scales_h u16][scales_l 4][qs 128]: w = (d (ls - 32)) kvalues[q]; sub-block c's 6-bit ls = nibble
// c % 2 of scales_l[c / 2] | bits 2c, 2c + 1 of scales_h << 4; its 32 indices in qs[16 c ...] as IQ4_NL.
// sc: sub-block c's scale d (ls - 32) for its groups 2c, 2c + 1; no offsets
struct IQ4_XSBlock {
  static constexpr int64_t QK = 256, BYTES = 136;
  static constexpr bool SIGNED = true;
  static void prepare(const uint8_t* p, float* sc) {
    const uint32_t sh = static_cast<uint32_t>(p[2]) | (static_cast<uint32_t>(p[3]) << 8);
    alignas(16) uint8_t ls[16] = {};
    for (int c = 0; c < 8; ++c) ls[c] = static_cast<uint8_t>(((p[4 + c / 2] >> (4 * (c % 2))) & 15) | (((sh >> (2 * c)) & 3) << 4));
    alignas(64) float v[16];
    vstore(v, vmul(vadd(u8_f(load_b16(ls)), vset1(-32.0f)), vset1(fp16_to_f32(p))));
    for (int c = 0; c < 8; ++c) sc[2 * c] = sc[2 * c + 1] = v[c];
    vstore(sc + 16, vzero());
  }
  static void quants(const uint8_t* p, int c, B16& lo, B16& hi) { iq4_values(load_b16(p + 8 + 16 * c), lo, hi); }
  static void chunk(const uint8_t* p, const float* sc, int c, VF& lo, VF& hi) {
    const VF s = vset1(sc[2 * c]);
    const B16 q = load_b16(p + 8 + 16 * c);
    lo = vmul(iq4_lo_f(q), s);
    hi = vmul(iq4_hi_f(q), s);
  }
};

// The scales T::chunk reads: T::chunk_scales where the type has one, else T::prepare's
template <typename T, typename = void>
struct HasChunkScales : std::false_type {};
template <typename T>
struct HasChunkScales<T, std::void_t<decltype(&T::chunk_scales)>> : std::true_type {};

template <typename T>
inline void chunk_scales(const uint8_t* p, float* sc) {
  if constexpr (HasChunkScales<T>::value) T::chunk_scales(p, sc);
  else T::prepare(p, sc);
}

// One block at p widened into its T::QK fp32 values at out (the values quant/dequantize.py computes).
template <typename T>
inline void widen_block(const uint8_t* p, float* out) {
  alignas(64) float sc[32];
  chunk_scales<T>(p, sc);
#pragma GCC unroll 8  // a constant chunk index: 3.7x the widening of a runtime one (Q4_K, one Zen 3 core)
  for (int c = 0; c < static_cast<int>(T::QK / 32); ++c) {
    VF lo, hi;
    T::chunk(p, sc, c, lo, hi);
    vstore(out + 32 * c, lo);
    vstore(out + 32 * c + 16, hi);
  }
}

}  // namespace scratchlm
