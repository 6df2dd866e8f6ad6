// Integer decode kernels on ggml blocks of every type, read in place (the "A8 row" formats): y = round(x) W^T.
//
// x is first rounded to 8 bits per block of the weight type (quant/act_quant.py holds the torch model):
//   32-value types (Q4_0 .. IQ4_NL, Q8_0, Q4_1)  per 32:  d = amax / 127, q = rne(x 127 / amax)  (round_act)
//   K-quants and IQ4_XS                          per 256: ggml's Q8_K: m = the x of largest |x|,
//                                                         q = min(127, rne(x (-127 / m))), d = 1 / (-127 / m)
// Then per weight block, per 16-value group g (w = s_g q + t_g, blocks.h's prepare / quants):
//   sum_{j in g} w_j (d qx_j) = d (s_g sum_j q_j qx_j) + t_g xs_g,    xs_g = d sum_{j in g} qx_j
// the integer sums exact (VNNI vpdpbusd, AVX2 vpmaddubsw, or a plain loop: simd.h's idot), then fp32:
// per block acc += d * sum_g s_g isum_g, and sum_g t_g xs_g. = F.linear(round(x), dequantized W) up to fp32
// rounding, the arithmetic of llama.cpp's vec_dot kernels (which round x the same way, with d in fp16 for Q8_0).

#pragma once

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "blocks.h"
#include "gemv_a8.h"
#include "simd_dot.h"

namespace scratchlm {

// x (B, K) rounded per qk (32 or 256) values.
struct ActRows {
  int64_t B = 0, K = 0, qk = 0;
  std::vector<int8_t> q;  // (B, K)
  std::vector<float> d;   // (B, K / qk)
  std::vector<float> xs;  // (B, K / 16): d sum q over each 16 values
};

// ggml's quantize_row_q8_K_ref for one block of 256.
inline void quantize_q8_k_block(const float* x, int8_t* q, float& d) {
  float amax = 0.f, mx = 0.f;
  for (int j = 0; j < 256; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) amax = ax, mx = x[j];
  }
  if (amax == 0.f) {
    d = 0.f;
    std::memset(q, 0, 256);
    return;
  }
  const float iscale = -127.f / mx;
  for (int j = 0; j < 256; ++j) q[j] = static_cast<int8_t>(std::min(127, static_cast<int>(std::nearbyint(iscale * x[j]))));
  d = 1.f / iscale;
}

inline void quantize_act_rows(const float* x, int64_t B, int64_t K, int64_t qk, ActRows& a) {
  a.B = B, a.K = K, a.qk = qk;
  const int64_t nb = K / qk;
  a.q.resize(B * K), a.d.resize(B * nb), a.xs.resize(B * K / 16);
  for (int64_t i = 0; i < B * nb; ++i) {
    int8_t* q = a.q.data() + i * qk;
    if (qk == 256) {
      quantize_q8_k_block(x + i * qk, q, a.d[i]);
    } else {
      int32_t sum;
      quantize_block(x + i * qk, q, a.d[i], sum);
    }
    for (int64_t g = 0; g < qk / 16; ++g) {
      int32_t s = 0;
      for (int j = 0; j < 16; ++j) s += q[16 * g + j];
      a.xs[i * (qk / 16) + g] = a.d[i] * static_cast<float>(s);
    }
  }
}

// NR weight rows n .. n + NR - 1 x NB activation rows b0 .. b0 + NB - 1 -> y[b * ldy + n].
template <typename Block, int NB, int NR>
inline void a8b_tile(const ActRows& a, const uint8_t* w, float* y, int64_t ldy, int64_t b0, int64_t n,
                     int64_t row_bytes) {
  constexpr int G = static_cast<int>(Block::QK / 16);  // 16-value groups per block
  const int64_t K = a.K, nblk = K / Block::QK;
  VF8 acc[NR][NB];
  VF tacc[NR][NB];  // the offsets' sums, 16 groups at a time (K-quants) ...
  float tsum[NR][NB] = {};  // ... or 2 (32-value blocks)
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = vzero8(), tacc[r][b] = vzero();
  for (int64_t i = 0; i < nblk; ++i) {
    alignas(64) float sc[NR][32];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + (n + r) * row_bytes + i * Block::BYTES;
      for (int64_t o = 0; o < Block::BYTES; o += 64) prefetch(blk + 2 * NR * row_bytes + o);
      Block::prepare(blk, sc[r]);
    }
    VF8 part[NR][NB];  // sum_g s_g isum_g of this block, lanes in group_sums' order
    for (int r = 0; r < NR; ++r)
      for (int b = 0; b < NB; ++b) part[r][b] = vzero8();
    if constexpr (G == 16) {  // 8 chunks: 4 at a time, their 8 groups' integer sums in one vector
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        VI8 dots[NR][NB][4];
#pragma GCC unroll 4
        for (int cc = 0; cc < 4; ++cc) {
          const int c = 4 * k + cc;
          for (int r = 0; r < NR; ++r) {
            B16 lo, hi;
            Block::quants(w + (n + r) * row_bytes + i * Block::BYTES, c, lo, hi);
            for (int b = 0; b < NB; ++b)
              dots[r][b][cc] = idot<Block::SIGNED>(lo, hi, a.q.data() + (b0 + b) * K + i * Block::QK + 32 * c);
          }
        }
        for (int r = 0; r < NR; ++r) {
          const VF8 s = vload8_eo(sc[r] + 8 * k);
          for (int b = 0; b < NB; ++b)
            part[r][b] = vfma8(group_sums(dots[r][b][0], dots[r][b][1], dots[r][b][2], dots[r][b][3]), s, part[r][b]);
        }
      }
    } else {  // a 32-value block: one scale for both groups
      for (int r = 0; r < NR; ++r) {
        B16 lo, hi;
        Block::quants(w + (n + r) * row_bytes + i * Block::BYTES, 0, lo, hi);
        for (int b = 0; b < NB; ++b)
          part[r][b] = vmul8(vcvt8(idot<Block::SIGNED>(lo, hi, a.q.data() + (b0 + b) * K + i * Block::QK)),
                             vset1_8(sc[r][0]));
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int b = 0; b < NB; ++b) {
        const float dx = a.d[(b0 + b) * nblk + i];
        acc[r][b] = vfma8(part[r][b], vset1_8(dx), acc[r][b]);
        const float* xs = a.xs.data() + (b0 + b) * (K / 16) + i * G;
        if constexpr (G == 16) {
          tacc[r][b] = vfma(vload(sc[r] + 16), vload(xs), tacc[r][b]);
        } else {
          for (int g = 0; g < G; ++g) tsum[r][b] = std::fma(sc[r][16 + g], xs[g], tsum[r][b]);
        }
      }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) y[(b0 + b) * ldy + n + r] = vsum8(acc[r][b]) + (vsum(tacc[r][b]) + tsum[r][b]);
}

template <typename Block, int NB>
inline void a8b_rows_nb(const ActRows& a, const uint8_t* w, float* y, int64_t ldy, int64_t b0, int64_t n0,
                        int64_t n1) {
  constexpr int NR = NB == 1 ? 2 : 1;
  const int64_t row_bytes = (a.K / Block::QK) * Block::BYTES;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) a8b_tile<Block, NB, NR>(a, w, y, ldy, b0, n, row_bytes);
  for (; n < n1; ++n) a8b_tile<Block, NB, 1>(a, w, y, ldy, b0, n, row_bytes);
}

// y[b, n] for rows [n0, n1), activation rows [b0, b0 + nb), nb <= BATCH_TILE; a rounded per Block::QK.
template <typename Block>
void a8b_rows(const ActRows& a, const uint8_t* w, float* y, int64_t ldy, int64_t b0, int64_t nb, int64_t n0,
              int64_t n1) {
  switch (nb) {
    case 1: return a8b_rows_nb<Block, 1>(a, w, y, ldy, b0, n0, n1);
    case 2: return a8b_rows_nb<Block, 2>(a, w, y, ldy, b0, n0, n1);
    case 3: return a8b_rows_nb<Block, 3>(a, w, y, ldy, b0, n0, n1);
    default: return a8b_rows_nb<Block, 4>(a, w, y, ldy, b0, n0, n1);
  }
}

}  // namespace scratchlm
