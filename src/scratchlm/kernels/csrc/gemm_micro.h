// The prompt GEMM's parts (block_gemm.h puts them together): x packed k-major in 16-token tiles (PackedX, with the
// x side of Strassen-Winograd: strassen_gemm.h), the register-blocked micro-kernels, and a weight slice widened
// exactly to fp32 (widen_slice).

#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "aligned_buffer.h"
#include "blocks.h"
#include "parallel.h"
#include "simd.h"

namespace scratchlm {

constexpr int64_t GEMM_NT = 16;        // tokens per tile: one VF of lanes
#if defined(SCRATCHLM_AVX512)
constexpr int GEMM_R = 12;  // weight rows per micro-kernel: 12 of the 32 zmm registers accumulate (6 chains left
                            // two FMA pipes x 4 cycles of latency short: Q4_K 128 rows +11-17%, RESULTS.md)
#else
constexpr int GEMM_R = 6;   // weight rows per micro-kernel: 6 VF accumulators (12 AVX2 registers)
#endif
constexpr int64_t GEMM_KC = 256;       // K per widened slice (a multiple of every block's QK)
constexpr int64_t GEMM_MC = 8 * GEMM_R;  // rows per row block: its sums at 128 tokens, 48 (96) x 128 fp32, in L2
constexpr int64_t GEMM_MIN_ROWS = 9;  // more rows than one of gemv.h's passes of 8 (RESULTS.md)
constexpr int64_t PACK_SPLIT = 32 * 1024;  // x values from which PackedX::pack splits its tiles over threads
constexpr int64_t SW_TOKENS = 4 * GEMM_NT;  // token slots per Strassen-Winograd unit: two halves of two tiles
constexpr int64_t SW_K = GEMM_KC;           // K per Strassen-Winograd chunk: one widened slice
constexpr int64_t SW_HALF = SW_K / 2;       // and its halves

// One level of Strassen-Winograd in the prompt GEMM (strassen_gemm.h), the default on every target; off (the
// module's set_strassen, for tests and benchmarks): every product the plain way.
inline std::atomic<bool> strassen_enabled{true};

#if defined(SCRATCHLM_AVX512)
// r[0..15] (16 rows of 16 floats) transposed in registers: afterwards r[j] holds the old rows' element j.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved by element
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // then pairs of pairs (64-bit elements)
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i)  // then 128-bit lanes of rows 4 apart
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {  // and of rows 8 apart
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}
#endif

// x (B, K) packed k-major in tiles of GEMM_NT tokens: t[(tile * K + k) * NT + lane], lanes past B zero.
// The buffer starts on a 64-byte line: a tile's row of 16 floats is one line (two loads that never split one).
struct PackedX {
  std::vector<float> buf;
  float* t = nullptr;  // into buf: not copyable
  int64_t B = 0, K = 0, tiles = 0;
  // Strassen-Winograd (strassen_gemm.h; units > 0: the first units * 4 tiles, from 49 tokens: a last partial tile's
  // padding lanes are zero tokens whose sums are not stored; K in `chunks` chunks of SW_K):
  // each token's row is packed scaled by a power of two, 1 / up[b], to a largest |value| in [0.5, 1) (exact;
  // gemm_block_rows multiplies back), so that a sum of two tokens' values below rounds at each one's own scale;
  // s holds the x side's sums per (unit, chunk): S1 = A21 + A22, S2 = S1 - A11, S3 = A11 - A21, S4 = A12 - S2
  // (A11: the unit's first 32 tokens x the chunk's first SW_HALF columns, A12 x its last; A21, A22 the unit's
  // last 32 tokens), each two tiles of SW_HALF x 16: s[(((unit * chunks + chunk) * 4 + i) * 2 + tile) * SW_HALF * 16].
  int64_t units = 0, chunks = 0;
  std::vector<float> up;
  FloatBuf s;

  // 2^e for a row of n values (n % 16 == 0) whose largest |value| is f * 2^e, f in [0.5, 1); e kept in [-64, 64]
  // (1 for a row of zeros); 0 for a row that holds an inf or a NaN
  static float up_scale(const float* row, int64_t n) {
    float top = 0.0f;
    bool bad = false;
#if defined(SCRATCHLM_AVX512)
    __m512 m = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t k = 0; k < n; k += 16) {
      const __m512 v = _mm512_loadu_ps(row + k);
      m = _mm512_max_ps(m, _mm512_abs_ps(v));
      nan |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_NEQ_UQ);  // v - v: NaN for inf / NaN
    }
    bad = nan != 0, top = _mm512_reduce_max_ps(m);
#elif defined(SCRATCHLM_AVX2)
    top = abs_max8(row, n, &bad);
#else
    for (int64_t k = 0; k < n; ++k) {
      if (!std::isfinite(row[k])) bad = true;
      top = std::max(top, std::fabs(row[k]));
    }
#endif
    if (bad) return 0.0f;
    int e = 0;
    if (top > 0.0f) std::frexp(top, &e);
    return std::ldexp(1.0f, std::clamp(e, -64, 64));
  }

  PackedX() = default;
  PackedX(const PackedX&) = delete;
  PackedX& operator=(const PackedX&) = delete;

  // One tile per task (on the calling thread's team when it has one): each writes its tile's lines in order,
  // reading its 16 token rows as 16 sequential streams; pad lanes written 0 (the buffer is reused, not cleared).
  void pack(const float* x, int64_t B_, int64_t K_) {
    B = B_, K = K_, tiles = (B + GEMM_NT - 1) / GEMM_NT;
    const size_t need = static_cast<size_t>(tiles * K * GEMM_NT + 16);
    if (buf.size() < need) buf.resize(need);
    t = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) / sizeof(float)) % 16) % 16;
    const bool sw = strassen_enabled.load(std::memory_order_relaxed) && K % SW_K == 0;
    units = sw ? tiles * GEMM_NT / SW_TOKENS : 0, chunks = K / SW_K;  // a last tile's padding lanes are zero tokens
    if (units > 0) up.resize(B); else up.clear();
    std::atomic<bool> finite{true};  // every token's x (Strassen-Winograd's condition, below)
    parallel_chunks(tiles, B * K >= PACK_SPLIT ? 1 : tiles, [&](int64_t t0, int64_t t1) {
      for (int64_t tile = t0; tile < t1; ++tile) {
        float* dst = t + tile * K * GEMM_NT;
        const int64_t b0 = tile * GEMM_NT, lanes = std::min(GEMM_NT, B - b0);
        const float* src = x + b0 * K;
        float down[GEMM_NT];  // each token's 1 / up (Strassen-Winograd's scaling, exact: a power of two), or 1
        for (int64_t l = 0; l < lanes; ++l) {
          const float u = units > 0 ? up_scale(src + l * K, K) : 1.0f;
          if (u == 0.0f) finite.store(false, std::memory_order_relaxed);
          if (units > 0) up[b0 + l] = u > 0.0f ? u : 1.0f;
          down[l] = units > 0 ? 1.0f / up[b0 + l] : 1.0f;
        }
        int64_t k = 0;
#if defined(SCRATCHLM_AVX512)
        for (; k + 16 <= K; k += 16) {  // 16 tokens x 16 columns through a register transpose: whole lines
          __m512 v[16];
          for (int64_t l = 0; l < 16; ++l) v[l] = l < lanes ? _mm512_loadu_ps(src + l * K + k) : _mm512_setzero_ps();
          if (units > 0)
            for (int64_t l = 0; l < lanes; ++l) v[l] = _mm512_mul_ps(v[l], _mm512_set1_ps(down[l]));
          transpose16(v);
          for (int i = 0; i < 16; ++i) _mm512_store_ps(dst + (k + i) * GEMM_NT, v[i]);
        }
#endif
        for (; k < K; ++k) {
          float* line = dst + k * GEMM_NT;
          for (int64_t l = 0; l < lanes; ++l) line[l] = src[l * K + k] * down[l];
          for (int64_t l = lanes; l < GEMM_NT; ++l) line[l] = 0.0f;
        }
      }
    });
    // an inf / NaN in a token's x would reach its partner's outputs through the sums (inf - inf): such a call
    // runs the plain order (the scaling stays: exact, undone as y lands)
    if (!finite.load()) units = 0;
    if (units > 0) sums();
  }

  // s from the packed tiles (see above), one (unit, chunk) per task
  void sums() {
    constexpr int64_t KC = SW_HALF, NT = GEMM_NT;
    const size_t need = static_cast<size_t>(units * chunks * 8 * KC * NT);
    if (s.size() < need) s.resize(need);
    parallel_chunks(units * chunks, units * chunks * KC * 64 >= PACK_SPLIT ? 1 : units * chunks,
                    [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t u = i / chunks, c = i % chunks;
        float* out = s.data() + i * 8 * KC * NT;
        for (int64_t h = 0; h < 2; ++h) {  // the half's two tiles
          const float* top = t + ((4 * u + h) * K + c * SW_K) * NT;      // A11 (A12 at + KC * NT)
          const float* bot = t + ((4 * u + 2 + h) * K + c * SW_K) * NT;  // A21 (A22 at + KC * NT)
          for (int64_t e = 0; e < KC * NT; e += 16) {
            const VF a11 = vload(top + e), a12 = vload(top + KC * NT + e);
            const VF a21 = vload(bot + e), a22 = vload(bot + KC * NT + e);
            const VF s1 = vadd(a21, a22), s2 = vsub(s1, a11);
            vstore(out + (0 * 2 + h) * KC * NT + e, s1);
            vstore(out + (1 * 2 + h) * KC * NT + e, s2);
            vstore(out + (2 * 2 + h) * KC * NT + e, vsub(a11, a21));
            vstore(out + (3 * 2 + h) * KC * NT + e, vsub(a12, s2));
          }
        }
      }
    });
  }
};

// c[r][0:NT] += sum_{k < kc} w[r * ldw + k] * xt[k * NT + 0:NT] for r < R (c: R x NT floats); the slice's sum
// is its own chain, added to c once (a K-long chain would round K times into one sum)
template <int R, int64_t KC>  // KC > 0: the slice width known at compile time (the full slices); 0: kc
inline void gemm_micro(const float* w, int64_t ldw, const float* xt, int64_t kc_, float* c) {
  const int64_t kc = KC > 0 ? KC : kc_;
#if defined(SCRATCHLM_AVX2)
  // two 8-lane halves per row written out: through VF, GCC folded x into every FMA as a memory operand (18
  // loads per 12 FMAs, load-port bound) or spilled accumulators
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 x0 = _mm256_loadu_ps(xt + k * GEMM_NT), x1 = _mm256_loadu_ps(xt + k * GEMM_NT + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_broadcast_ss(w + r * ldw + k);
      lo[r] = _mm256_fmadd_ps(wv, x0, lo[r]);
      hi[r] = _mm256_fmadd_ps(wv, x1, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * GEMM_NT;
    _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), lo[r]));
    _mm256_storeu_ps(cr + 8, _mm256_add_ps(_mm256_loadu_ps(cr + 8), hi[r]));
  }
#else
  VF acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vzero();
  for (int64_t k = 0; k < kc; ++k) {
    const VF xv = vload(xt + k * GEMM_NT);
    for (int r = 0; r < R; ++r) acc[r] = vfma(vset1(w[r * ldw + k]), xv, acc[r]);
  }
  for (int r = 0; r < R; ++r) vstore(c + r * GEMM_NT, vadd(vload(c + r * GEMM_NT), acc[r]));
#endif
}

template <int64_t KC>
inline void gemm_micro_rows(int rows, const float* w, int64_t ldw, const float* xt, int64_t kc, float* c) {
  switch (rows) {
#if defined(SCRATCHLM_AVX512)
    case 12: return gemm_micro<12, KC>(w, ldw, xt, kc, c);
    case 11: return gemm_micro<11, KC>(w, ldw, xt, kc, c);
    case 10: return gemm_micro<10, KC>(w, ldw, xt, kc, c);
    case 9: return gemm_micro<9, KC>(w, ldw, xt, kc, c);
    case 8: return gemm_micro<8, KC>(w, ldw, xt, kc, c);
    case 7: return gemm_micro<7, KC>(w, ldw, xt, kc, c);
#endif
    case 6: return gemm_micro<6, KC>(w, ldw, xt, kc, c);
    case 5: return gemm_micro<5, KC>(w, ldw, xt, kc, c);
    case 4: return gemm_micro<4, KC>(w, ldw, xt, kc, c);
    case 3: return gemm_micro<3, KC>(w, ldw, xt, kc, c);
    case 2: return gemm_micro<2, KC>(w, ldw, xt, kc, c);
    default: return gemm_micro<1, KC>(w, ldw, xt, kc, c);
  }
}

#if defined(SCRATCHLM_AVX512)
// gemm_micro for two token tiles at once (xa, xb into ca, cb): each broadcast weight feeds two FMAs (24 of the 32
// registers accumulate at R = 12). One core, a 96 x 256 slice against 128 tokens: 246-250 GFLOP/s against 225 for
// one tile at a time (the broadcasts take issue slots of their own). Each output's sum is gemm_micro's, op for op.
template <int R, int64_t KC>
inline void gemm_micro2(const float* w, int64_t ldw, const float* xa, const float* xb, int64_t kc_, float* ca,
                        float* cb) {
  const int64_t kc = KC > 0 ? KC : kc_;
  VF a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = vzero();
  for (int64_t k = 0; k < kc; ++k) {
    const VF x0 = vload(xa + k * GEMM_NT), x1 = vload(xb + k * GEMM_NT);
    for (int r = 0; r < R; ++r) {
      const VF wv = vset1(w[r * ldw + k]);
      a[r] = vfma(wv, x0, a[r]);
      b[r] = vfma(wv, x1, b[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    vstore(ca + r * GEMM_NT, vadd(vload(ca + r * GEMM_NT), a[r]));
    vstore(cb + r * GEMM_NT, vadd(vload(cb + r * GEMM_NT), b[r]));
  }
}

template <int64_t KC>
inline void gemm_micro2_rows(int rows, const float* w, int64_t ldw, const float* xa, const float* xb, int64_t kc,
                             float* ca, float* cb) {
  switch (rows) {
    case 12: return gemm_micro2<12, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 11: return gemm_micro2<11, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 10: return gemm_micro2<10, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 9: return gemm_micro2<9, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 8: return gemm_micro2<8, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 7: return gemm_micro2<7, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 6: return gemm_micro2<6, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 5: return gemm_micro2<5, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 4: return gemm_micro2<4, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 3: return gemm_micro2<3, KC>(w, ldw, xa, xb, kc, ca, cb);
    case 2: return gemm_micro2<2, KC>(w, ldw, xa, xb, kc, ca, cb);
    default: return gemm_micro2<1, KC>(w, ldw, xa, xb, kc, ca, cb);
  }
}
#endif

// The bytes of `rows` rows of W from w (row_bytes apart), columns [k0, k0 + kc), prefetched into L2: rows row_bytes
// apart are not a stream the hardware prefetcher follows
template <typename Block>
inline void prefetch_slice(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k0, int64_t kc) {
  const uint8_t* p = w + k0 / Block::QK * Block::BYTES;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kc / Block::QK * Block::BYTES; b += 64) __builtin_prefetch(p + r * row_bytes + b, 0, 2);
}

// `rows` rows of W from w (row_bytes apart), columns [k0, k0 + kc), widened into out (rows x kc, ld GEMM_KC).
template <typename Block>
inline void widen_slice(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k0, int64_t kc, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* blk = w + r * row_bytes + k0 / Block::QK * Block::BYTES;
    for (int64_t i = 0; i < kc / Block::QK; ++i)
      widen_block<Block>(blk + i * Block::BYTES, out + r * GEMM_KC + i * Block::QK);
  }
}

}  // namespace scratchlm
