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
// Rows are split over torch's intra-op threads (at::parallel_for: torch's own OpenMP pool).
// With AVX-512 (built with -march=native on such a CPU) the inner loops use 16-lane intrinsics;
// otherwise a portable loop the compiler vectorizes for whatever the machine has.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SCRATCHLM_AVX512 1
#endif

namespace {

constexpr int64_t QK = 32;           // values per ggml block
constexpr int64_t Q8_0_BYTES = 34;   // 2 (d) + 32
constexpr int64_t Q4_1_BYTES = 20;   // 2 (d) + 2 (m) + 16
constexpr int64_t BATCH_TILE = 4;    // batch rows sharing one dequantized weight vector

float fp16_to_f32(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
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
#endif

// y[b, n] = sum_k x[b, k] * w[n, k] for rows n in [n0, n1), batch rows [b0, b0 + nb), nb <= BATCH_TILE.
template <typename Block>
void block_rows(const float* x, const uint8_t* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t nb,
                int64_t n0, int64_t n1) {
  const int64_t nblk = K / QK, row_bytes = nblk * Block::bytes;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
#ifdef SCRATCHLM_AVX512
    __m512 acc[BATCH_TILE][2];
    for (int64_t b = 0; b < nb; ++b) acc[b][0] = acc[b][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nblk; ++i) {
      __m512 lo, hi;
      dequant_avx512(Block{}, row + i * Block::bytes, lo, hi);
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + (b0 + b) * K + i * QK;
        acc[b][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc[b][0]);
        acc[b][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), acc[b][1]);
      }
    }
    for (int64_t b = 0; b < nb; ++b) y[(b0 + b) * N + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[b][0], acc[b][1]));
#else
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
#endif
  }
}

// Dense rows: fp32 or bf16 (uint16 bits) weights, K a multiple of 16.
template <typename T>
void dense_rows(const float* x, const T* w, float* y, int64_t K, int64_t N, int64_t b0, int64_t nb, int64_t n0,
                int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const T* row = w + n * K;
#ifdef SCRATCHLM_AVX512
    __m512 acc[BATCH_TILE];
    for (int64_t b = 0; b < nb; ++b) acc[b] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      __m512 wv;
      if constexpr (sizeof(T) == 4) {
        wv = _mm512_loadu_ps(reinterpret_cast<const float*>(row + k));
      } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
        wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      for (int64_t b = 0; b < nb; ++b) acc[b] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (b0 + b) * K + k), acc[b]);
    }
    for (int64_t b = 0; b < nb; ++b) y[(b0 + b) * N + n] = _mm512_reduce_add_ps(acc[b]);
#else
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
#endif
  }
}

// Rows per task: enough work to amortise waking a thread (~64 KB of weights), so a 2-thread split
// only happens on matrices where it pays.
int64_t grain(int64_t row_bytes) { return std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(row_bytes, 1)); }

void check_x(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous fp32 CPU tensor (B, K), got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(x.size(1) == K, "x has ", x.size(1), " columns, the matrix has K = ", K);
}

template <typename RowFn>
torch::Tensor run_rows(const torch::Tensor& x, int64_t N, int64_t row_bytes, RowFn rows) {
  const int64_t B = x.size(0);
  auto y = torch::empty({B, N}, x.options());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, grain(row_bytes), [&](int64_t n0, int64_t n1) {
    for (int64_t b0 = 0; b0 < B; b0 += BATCH_TILE) rows(yp, b0, std::min(BATCH_TILE, B - b0), n0, n1);
  });
  return y;
}

template <typename Block>
torch::Tensor linear_blocks(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K) {
  check_x(x, K);
  TORCH_CHECK(K % QK == 0, "K = ", K, " is not a multiple of the block size 32");
  TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.is_contiguous() && w.numel() == N * (K / QK) * Block::bytes,
              "blocks must be contiguous uint8 with ", N * (K / QK) * Block::bytes, " bytes, got ", w.numel());
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  return run_rows(x, N, (K / QK) * Block::bytes, [&](float* yp, int64_t b0, int64_t nb, int64_t n0, int64_t n1) {
    block_rows<Block>(xp, wp, yp, K, N, b0, nb, n0, n1);
  });
}

template <typename T>
torch::Tensor linear_dense(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "w must be a contiguous (N, K) matrix");
  const int64_t N = w.size(0), K = w.size(1);
  check_x(x, K);
  TORCH_CHECK(K % 16 == 0, "K = ", K, " is not a multiple of 16");
  const float* xp = x.data_ptr<float>();
  const T* wp = reinterpret_cast<const T*>(w.data_ptr());
  return run_rows(x, N, K * static_cast<int64_t>(sizeof(T)), [&](float* yp, int64_t b0, int64_t nb, int64_t n0, int64_t n1) {
    dense_rows<T>(xp, wp, yp, K, N, b0, nb, n0, n1);
  });
}

torch::Tensor linear_q4_1(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K) {
  return linear_blocks<Q4_1Block>(x, w, N, K);
}

torch::Tensor linear_q8_0(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K) {
  return linear_blocks<Q8_0Block>(x, w, N, K);
}

torch::Tensor linear_f32(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == torch::kFloat32, "w must be fp32, got ", w.scalar_type());
  return linear_dense<float>(x, w);
}

torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16, "w must be bf16, got ", w.scalar_type());
  return linear_dense<uint16_t>(x, w);
}

bool has_avx512() {
#ifdef SCRATCHLM_AVX512
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_q4_1", &linear_q4_1, "x (B, K) fp32 @ Q4_1 blocks (N, K)^T -> (B, N)");
  m.def("linear_q8_0", &linear_q8_0, "x (B, K) fp32 @ Q8_0 blocks (N, K)^T -> (B, N)");
  m.def("linear_f32", &linear_f32, "x (B, K) fp32 @ W (N, K) fp32 ^T -> (B, N)");
  m.def("linear_bf16", &linear_bf16, "x (B, K) fp32 @ W (N, K) bf16 ^T -> (B, N)");
  m.def("has_avx512", &has_avx512, "built with the AVX-512 inner loops");
}
