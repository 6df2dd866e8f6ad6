// scratchlm decode kernels: y (B, N) = x (B, K) @ W^T for small B (decoding), W stored compactly.
//
// Every kernel dequantizes W exactly to fp32 in registers and accumulates x * w with fp32 FMAs, so it
// computes the same function as F.linear(x, dequantized W) (up to fp32 summation order):
//   f32    w = W[n, k]
//   bf16   w = bf16 bits << 16                         (exact widening)
//   q8_0   w = d * q      per 32-block: d fp16, q int8  (exact in fp32: 11 x 8 significant bits)
//   q4_1   w = d * q + m  per 32-block: d, m fp16, q 4-bit; one rounding, as gguf-py's (d * q) + m
//          (d * q is exact in fp32, so fma(d, q, m) == fl(fl(d * q) + m))
// ggml block layouts (bytes): q8_0 = [d f16][32 x int8] (34); q4_1 = [d f16][m f16][16 bytes: element
// j in the low nibble of byte j, element j + 16 in the high nibble] (20).
// matrix_ref.h splits rows over threads; gemv_a8.h holds the integer (8-bit activation) kernels.
// With AVX-512 (built with -march=native on such a CPU) the inner loops use 16-lane intrinsics;
// otherwise a portable loop the compiler vectorizes for whatever the machine has.

#pragma once

#include <algorithm>
#include <cmath>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SCRATCHLM_AVX512 1
#endif

namespace scratchlm {

constexpr int64_t QK = 32;           // values per ggml block
constexpr int64_t Q8_0_BYTES = 34;   // 2 (d) + 32
constexpr int64_t Q4_1_BYTES = 20;   // 2 (d) + 2 (m) + 16
constexpr int64_t BATCH_TILE = 4;    // batch rows sharing one dequantized weight vector

inline float fp16_to_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef SCRATCHLM_AVX512
  return _cvtsh_ss(h);  // F16C: exact widening
#else
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: value = mant * 2^-24, exact in fp32
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// One 32-value weight block, dequantized into w[32] (portable path).
struct Q4_1Block {
  static constexpr int64_t bytes = Q4_1_BYTES;
  static void dequant(const uint8_t* p, float* w) {
    const float d = fp16_to_f32(p), m = fp16_to_f32(p + 2);
    for (int j = 0; j < 16; ++j) {
      w[j] = std::fma(d, static_cast<float>(p[4 + j] & 0x0f), m);
      w[j + 16] = std::fma(d, static_cast<float>(p[4 + j] >> 4), m);
    }
  }
};

struct Q8_0Block {
  static constexpr int64_t bytes = Q8_0_BYTES;
  static void dequant(const uint8_t* p, float* w) {
    const float d = fp16_to_f32(p);
    for (int j = 0; j < 32; ++j) w[j] = d * static_cast<float>(static_cast<int8_t>(p[2 + j]));
  }
};

#ifdef SCRATCHLM_AVX512
// The same blocks as two 16-lane fp32 vectors (lo = elements 0..15, hi = 16..31).
inline void dequant_avx512(const Q4_1Block&, const uint8_t* p, __m512& lo, __m512& hi) {
  const __m512 d = _mm512_set1_ps(fp16_to_f32(p)), m = _mm512_set1_ps(fp16_to_f32(p + 2));
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4)));
  lo = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0x0f))), m);
  hi = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), m);
}

inline void dequant_avx512(const Q8_0Block&, const uint8_t* p, __m512& lo, __m512& hi) {
  const __m512 d = _mm512_set1_ps(fp16_to_f32(p));
  lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)))));
  hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18)))));
}

// NR weight rows x NB batch rows at once, every accumulator a register: NR * NB * 2 independent FMA
// chains hide the FMA latency (one row alone is a 4-cycle-per-block dependency chain).
template <typename Block, int NB, int NR>
inline void block_tile(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t n,
                       int64_t row_bytes) {
  __m512 acc[NR][NB][2];
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b][0] = acc[r][b][1] = _mm512_setzero_ps();
  const int64_t nblk = K / QK;
  for (int64_t i = 0; i < nblk; ++i) {
    __m512 xv[NB][2];
    for (int b = 0; b < NB; ++b) {
      xv[b][0] = _mm512_loadu_ps(x + (b0 + b) * K + i * QK);
      xv[b][1] = _mm512_loadu_ps(x + (b0 + b) * K + i * QK + 16);
    }
    for (int r = 0; r < NR; ++r) {
      __m512 lo, hi;
      const uint8_t* blk = w + (n + r) * row_bytes + i * Block::bytes;
      // the same block of the next tile: keeps DRAM reads in flight while the FMAs run
      _mm_prefetch(reinterpret_cast<const char*>(blk + 2 * NR * row_bytes), _MM_HINT_T0);
      dequant_avx512(Block{}, blk, lo, hi);
      for (int b = 0; b < NB; ++b) {
        acc[r][b][0] = _mm512_fmadd_ps(lo, xv[b][0], acc[r][b][0]);
        acc[r][b][1] = _mm512_fmadd_ps(hi, xv[b][1], acc[r][b][1]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) y[(b0 + b) * N + n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][b][0], acc[r][b][1]));
}

template <typename Block, int NB>
inline void block_rows_nb(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t n0,
                          int64_t n1) {
  constexpr int NR = NB == 1 ? 4 : (NB == 2 ? 2 : 1);
  const int64_t row_bytes = (K / QK) * Block::bytes;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) block_tile<Block, NB, NR>(x, w, y, K, N, b0, n, row_bytes);
  for (; n < n1; ++n) block_tile<Block, NB, 1>(x, w, y, K, N, b0, n, row_bytes);
}
#endif

// y[b, n] = sum_k x[b, k] * w[n, k] for rows n in [n0, n1), batch rows [b0, b0 + nb), nb <= BATCH_TILE.
template <typename Block>
void block_rows(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t nb,
                int64_t n0, int64_t n1) {
#ifdef SCRATCHLM_AVX512
  switch (nb) {
    case 1: return block_rows_nb<Block, 1>(x, w, y, K, N, b0, n0, n1);
    case 2: return block_rows_nb<Block, 2>(x, w, y, K, N, b0, n0, n1);
    case 3: return block_rows_nb<Block, 3>(x, w, y, K, N, b0, n0, n1);
    default: return block_rows_nb<Block, 4>(x, w, y, K, N, b0, n0, n1);
  }
#else
  const int64_t nblk = K / QK, row_bytes = nblk * Block::bytes;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    float acc[BATCH_TILE][QK] = {};
    float wv[QK];
    for (int64_t i = 0; i < nblk; ++i) {
      Block::dequant(row + i * Block::bytes, wv);
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + (b0 + b) * K + i * QK;
        for (int j = 0; j < QK; ++j) acc[b][j] = std::fma(wv[j], xb[j], acc[b][j]);
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      float s = 0.f;
      for (int j = 0; j < QK; ++j) s += acc[b][j];
      y[(b0 + b) * N + n] = s;
    }
  }
#endif
}

#ifdef SCRATCHLM_AVX512
template <typename T>
inline __m512 load_widened(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  } else {  // bf16: the bits are the high half of an fp32
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <typename T, int NB>
inline void dense_rows_nb(const float* x, const T* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t n0,
                          int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const T* row = w + n * K;
    __m512 acc[NB][2];
    for (int b = 0; b < NB; ++b) acc[b][0] = acc[b][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(row + K + k), _MM_HINT_T0);  // the next row
      const __m512 w0 = load_widened(row + k), w1 = load_widened(row + k + 16);
      for (int b = 0; b < NB; ++b) {
        acc[b][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (b0 + b) * K + k), acc[b][0]);
        acc[b][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (b0 + b) * K + k + 16), acc[b][1]);
      }
    }
    for (; k < K; k += 16) {
      const __m512 w0 = load_widened(row + k);
      for (int b = 0; b < NB; ++b) acc[b][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (b0 + b) * K + k), acc[b][0]);
    }
    for (int b = 0; b < NB; ++b) y[(b0 + b) * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]));
  }
}
#endif

// Dense rows: fp32 or bf16 (uint16 bits) weights, K a multiple of 16.
template <typename T>
void dense_rows(const float* x, const T* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t nb, int64_t n0,
                int64_t n1) {
#ifdef SCRATCHLM_AVX512
  switch (nb) {
    case 1: return dense_rows_nb<T, 1>(x, w, y, K, N, b0, n0, n1);
    case 2: return dense_rows_nb<T, 2>(x, w, y, K, N, b0, n0, n1);
    case 3: return dense_rows_nb<T, 3>(x, w, y, K, N, b0, n0, n1);
    default: return dense_rows_nb<T, 4>(x, w, y, K, N, b0, n0, n1);
  }
#else
  for (int64_t n = n0; n < n1; ++n) {
    const T* row = w + n * K;
    for (int64_t b = 0; b < nb; ++b) {
      float acc[16] = {};
      const float* xb = x + (b0 + b) * K;
      for (int64_t k = 0; k < K; k += 16) {
        for (int j = 0; j < 16; ++j) {
          float wv;
          if constexpr (sizeof(T) == 4) {
            wv = reinterpret_cast<const float*>(row)[k + j];
          } else {
            const uint32_t bits = static_cast<uint32_t>(row[k + j]) << 16;
            std::memcpy(&wv, &bits, 4);
          }
          acc[j] = std::fma(wv, xb[k + j], acc[j]);
        }
      }
      float s = 0.f;
      for (int j = 0; j < 16; ++j) s += acc[j];
      y[(b0 + b) * N + n] = s;
    }
  }
#endif
}

}  // namespace scratchlm
