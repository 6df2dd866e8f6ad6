// Integer decode kernels: y (B, N) = x (B, K) @ W^T with W in ggml Q8_0 / Q4_1 blocks AND x quantized to
// 8 bits per 32-block first (the activation quantization llama.cpp's CPU backend does: ggml's Q8_0 x Q8_0
// and Q4_1 x Q8_1 dot products). An approximate function of x (its rounding), exact integer math after:
//   x block (32 values):  d_x = amax / 127,  q_x = rne(x * (127 / amax))  (int8; 0 where amax = 0; d_x fp32)
//   Q8_0 row block:       w = d_w q_w                 ->  d_w d_x sum_j q_w q_x
//   Q4_1 row block:       w = d_w q_w + m_w (q_w 0..15) ->  d_w d_x sum_j q_w q_x + m_w (d_x sum_j q_x)
//   y[b, n] = sum over blocks of those terms (fp32: one rounding for d_w d_x, fma accumulation)
// = F.linear(d_x q_x, dequantized W) up to fp32 rounding (the torch reference: quant/act_quant.py).
//
// Layout ("A8" formats, repacked once from the ggml blocks by pack_q8_0_a8 / pack_q4_1_a8): rows in groups
// of 16 (one int32 lane each, N padded to a multiple of 16 with zero rows), blocks of a group contiguous:
//   Q8_0_A8  weights (G, nb, 8, 16, 4) uint8 = q_w + 128 (VNNI multiplies unsigned x signed bytes; the
//            + 128 is removed by starting each block's sum at -128 sum q_x), scales (G, nb, 16) fp16 d_w
//   Q4_1_A8  weights (G, nb, 4, 16, 4) bytes: low nibble q_w[k = 8j + t], high nibble q_w[8j + 4 + t],
//            scales (G, nb, 2, 16) fp16: d_w of the 16 rows, then m_w
// so that one 64-byte load holds 4 consecutive k of 16 rows, and one vpdpbusd against those 4 bytes of
// q_x broadcast adds them into 16 row sums: 8 (Q8_0) or 8 (Q4_1: 4 loads, 2 nibble halves) per block.
// Byte for byte as many weight bytes as the ggml blocks (34 / 20 per 32 weights).
// With AVX512-VNNI the kernels are intrinsics; otherwise a portable loop with the same integer sums and
// the same fp32 operations in the same order (identical results).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemv.h"

#if defined(SCRATCHLM_AVX512) && defined(__AVX512VNNI__)
#define SCRATCHLM_VNNI 1
#endif

namespace scratchlm {

constexpr int64_t GROUP = 16;  // weight rows per interleaved group (16 int32 lanes)

// The activation rows, quantized per 32-block (see the header).
struct ActQ8 {
  int64_t B = 0, K = 0, nb = 0;
  std::vector<int8_t> q;      // (B, K) q_x
  std::vector<float> d;       // (B, nb) d_x
  std::vector<int32_t> corr;  // (B, nb) -128 sum q_x: the Q8_0 kernel's start value (undoes q_w + 128)
  std::vector<float> dsum;    // (B, nb) d_x sum q_x: the Q4_1 kernel's m_w term
};

// One 32-value block: q = rne(x * id), id = 127 / amax (0 when amax = 0), d = amax / 127.
inline void quantize_block(const float* x, int8_t* q, float& d, int32_t& sum) {
#ifdef SCRATCHLM_AVX512
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const __m512 id = _mm512_set1_ps(amax > 0.f ? 127.0f / amax : 0.f);
  constexpr int RNE = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, id), RNE);
  const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, id), RNE);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
  sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
  float amax = 0.f;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float id = amax > 0.f ? 127.0f / amax : 0.f;
  int32_t s = 0;
  for (int j = 0; j < QK; ++j) {
    const int v = static_cast<int>(std::nearbyint(x[j] * id));  // the default rounding mode: to nearest even
    q[j] = static_cast<int8_t>(v);
    s += v;
  }
  sum = s;
#endif
  d = amax / 127.0f;
}

inline void quantize_rows(const float* x, int64_t B, int64_t K, ActQ8& a) {
  a.B = B, a.K = K, a.nb = K / QK;
  a.q.resize(B * K), a.d.resize(B * a.nb), a.corr.resize(B * a.nb), a.dsum.resize(B * a.nb);
  for (int64_t i = 0; i < B * a.nb; ++i) {
    int32_t sum;
    quantize_block(x + i * QK, a.q.data() + i * QK, a.d[i], sum);
    a.corr[i] = -128 * sum;
    a.dsum[i] = a.d[i] * static_cast<float>(sum);
  }
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

constexpr int64_t a8_wbytes(bool q4) { return q4 ? 256 : 512; }  // weight bytes per block of 16 rows
constexpr int64_t a8_scales(bool q4) { return q4 ? 32 : 16; }     // fp16 scales per block of 16 rows

// One group of 16 rows x NB activation rows [b0, b0 + NB): out[b][r] = row 16g + r's dot with x_b.
// w: the group's weight bytes; s: its fp16 scales (see the header for both layouts).
#ifdef SCRATCHLM_VNNI
template <bool Q4, int NB>
inline void a8_group(const uint8_t* w, const uint16_t* s, const ActQ8& a, int64_t b0, float (*out)[GROUP]) {
  const int64_t nb = a.nb, K = a.K;
  constexpr int64_t WBYTES = a8_wbytes(Q4), SCALES = a8_scales(Q4);
  __m512 acc[NB], accm[NB];
  for (int b = 0; b < NB; ++b) acc[b] = accm[b] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* wb = w + i * WBYTES;
    _mm_prefetch(reinterpret_cast<const char*>(wb + 8 * WBYTES), _MM_HINT_T0);
    __m512i s0[NB], s1[NB];
    for (int b = 0; b < NB; ++b) {
      s0[b] = Q4 ? _mm512_setzero_si512() : _mm512_set1_epi32(a.corr[(b0 + b) * nb + i]);
      s1[b] = _mm512_setzero_si512();
    }
    for (int j = 0; j < (Q4 ? 4 : 8); j += (Q4 ? 1 : 2)) {
      const __m512i v = _mm512_loadu_si512(wb + j * 64);
      const __m512i w0 = Q4 ? _mm512_and_si512(v, low) : v;
      const __m512i w1 = Q4 ? _mm512_and_si512(_mm512_srli_epi16(v, 4), low) : _mm512_loadu_si512(wb + (j + 1) * 64);
      for (int b = 0; b < NB; ++b) {
        const int8_t* xq = a.q.data() + (b0 + b) * K + i * QK + j * (Q4 ? 8 : 4);
        s0[b] = _mm512_dpbusd_epi32(s0[b], w0, _mm512_set1_epi32(load_i32(xq)));
        s1[b] = _mm512_dpbusd_epi32(s1[b], w1, _mm512_set1_epi32(load_i32(xq + 4)));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * SCALES)));
    const __m512 mw = Q4 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * SCALES + 16)))
                         : _mm512_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      const int64_t blk = (b0 + b) * nb + i;
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(s0[b], s1[b]));
      acc[b] = _mm512_fmadd_ps(sums, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[blk])), acc[b]);
      if (Q4) accm[b] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.dsum[blk]), accm[b]);
    }
  }
  for (int b = 0; b < NB; ++b) _mm512_storeu_ps(out[b], Q4 ? _mm512_add_ps(acc[b], accm[b]) : acc[b]);
}
#else
// The portable loop: the same integer sums, the same fp32 operations in the same order.
template <bool Q4, int NB>
inline void a8_group(const uint8_t* w, const uint16_t* s, const ActQ8& a, int64_t b0, float (*out)[GROUP]) {
  const int64_t nb = a.nb, K = a.K;
  constexpr int64_t WBYTES = a8_wbytes(Q4), SCALES = a8_scales(Q4);
  float acc[NB][GROUP] = {}, accm[NB][GROUP] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* wb = w + i * WBYTES;
    for (int b = 0; b < NB; ++b) {
      const int64_t blk = (b0 + b) * nb + i;
      const int8_t* xq = a.q.data() + (b0 + b) * K + i * QK;
      int32_t sums[GROUP];
      for (int r = 0; r < GROUP; ++r) sums[r] = Q4 ? 0 : a.corr[blk];
      for (int j = 0; j < (Q4 ? 4 : 8); ++j) {
        for (int r = 0; r < GROUP; ++r) {
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = wb[(j * GROUP + r) * 4 + t];
            if (Q4) {
              sums[r] += (byte & 0x0f) * xq[8 * j + t] + (byte >> 4) * xq[8 * j + 4 + t];
            } else {
              sums[r] += byte * xq[4 * j + t];
            }
          }
        }
      }
      for (int r = 0; r < GROUP; ++r) {
        const float dw = fp16_to_f32(reinterpret_cast<const uint8_t*>(s + i * SCALES + r));
        acc[b][r] = std::fma(static_cast<float>(sums[r]), dw * a.d[blk], acc[b][r]);
        if (Q4) {
          const float mw = fp16_to_f32(reinterpret_cast<const uint8_t*>(s + i * SCALES + 16 + r));
          accm[b][r] = std::fma(mw, a.dsum[blk], accm[b][r]);
        }
      }
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < GROUP; ++r) out[b][r] = Q4 ? acc[b][r] + accm[b][r] : acc[b][r];
}
#endif

// Rows of groups [g0, g1) for activation rows [b0, b0 + nb_rows), nb_rows <= BATCH_TILE, into out (B, 16) tiles.
template <bool Q4>
inline void a8_rows(const uint8_t* w, const uint16_t* s, const ActQ8& a, int64_t b0, int64_t nrows, int64_t g,
                    float (*out)[GROUP]) {
  const int64_t wg = a.nb * (Q4 ? 256 : 512), sg = a.nb * (Q4 ? 32 : 16);
  w += g * wg, s += g * sg;
  switch (nrows) {
    case 1: return a8_group<Q4, 1>(w, s, a, b0, out);
    case 2: return a8_group<Q4, 2>(w, s, a, b0, out);
    case 3: return a8_group<Q4, 3>(w, s, a, b0, out);
    default: return a8_group<Q4, 4>(w, s, a, b0, out);
  }
}

// ggml q of element e (0..31) of a block's quants: Q8_0 int8 q[e]; Q4_1 nibble (e < 16: low of byte e).
inline int q4_1_quant(const uint8_t* nibbles, int e) { return e < 16 ? nibbles[e] & 0x0f : nibbles[e - 16] >> 4; }

// ggml blocks (N rows of K / 32 blocks) -> the A8 layout above: weights and scales (uint16 fp16 bits).
inline void pack_a8(bool q4, const uint8_t* blocks, int64_t N, int64_t K, uint8_t* w, uint16_t* s) {
  const int64_t nb = K / QK, G = (N + GROUP - 1) / GROUP, bytes = q4 ? Q4_1_BYTES : Q8_0_BYTES;
  const int64_t wbytes = q4 ? 256 : 512, scales = q4 ? 32 : 16;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t* wb = w + (g * nb + i) * wbytes;
      uint16_t* sb = s + (g * nb + i) * scales;
      for (int64_t r = 0; r < GROUP; ++r) {
        const int64_t n = g * GROUP + r;
        const uint8_t* blk = n < N ? blocks + (n * nb + i) * bytes : nullptr;  // padding rows: all zero
        uint16_t d = 0, m = 0;
        if (blk) std::memcpy(&d, blk, 2);
        if (blk && q4) std::memcpy(&m, blk + 2, 2);
        sb[r] = d;
        if (q4) sb[GROUP + r] = m;
        for (int e = 0; e < QK; ++e) {
          if (q4) {
            const int q = blk ? q4_1_quant(blk + 4, e) : 0, j = e / 8, t = e % 4, high = (e % 8) >= 4;
            uint8_t& byte = wb[(j * GROUP + r) * 4 + t];
            byte = high ? static_cast<uint8_t>((byte & 0x0f) | (q << 4)) : static_cast<uint8_t>((byte & 0xf0) | q);
          } else {
            const int8_t q = blk ? static_cast<int8_t>(blk[2 + e]) : 0;
            wb[((e / 4) * GROUP + r) * 4 + e % 4] = static_cast<uint8_t>(q) ^ 0x80;  // q + 128
          }
        }
      }
    }
  }
}

inline int64_t a8_weight_bytes(bool q4, int64_t N, int64_t K) {
  return (N + GROUP - 1) / GROUP * (K / QK) * (q4 ? 256 : 512);
}

inline int64_t a8_scale_count(bool q4, int64_t N, int64_t K) {
  return (N + GROUP - 1) / GROUP * (K / QK) * (q4 ? 32 : 16);
}

}  // namespace scratchlm
