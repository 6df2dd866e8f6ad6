// Prompt-sized products y (B, N) = x (B, K) @ W^T with W in ggml blocks, for B past a few rows: a GEMM on
// blocks widened exactly to fp32, once per call.
//
// gemv.h widens every weight chunk in registers for each pass of up to 8 batch rows, and sums along K in each
// lane (a dot product per (row, token), loads of x and of W for every FMA): at a prompt's 16-128 rows that
// is ~30% of the FMA peak. Here, as in a BLAS GEMM, the work is blocked so that each operand is reused from
// the cache that holds it:
//   x  is packed once per call k-major in tiles of NT = 16 tokens, xt[tile][k][16] (zero-padded tokens);
//   W  is walked in row blocks of MC rows; for each KC-column slice, one group of R rows at a time is widened into
//      a scratch block that stays in L1 (the same values as dequantize, bit for bit: blocks.h's chunk), once per
//      call, and multiplied with every token tile of the slice;
//   the micro-kernel keeps R x NT outputs in registers (R = 6 weight rows x 16 tokens = 12 AVX2 registers; 12
//   rows = 12 zmm registers on AVX-512):
//      for each k: acc[r][0:16] += w[r][k] (broadcast) * xt[k][0:16] (two vector loads),
//   accumulating into a (block rows, tiles, NT) scratch across the K slices, stored to y (store_block) once the
//   row block's last slice is done, while its sums are still in L2.
// Every y[t, n] is sum_k x[t, k] w[n, k] in one fixed order (k ascending within a KC slice, the slices' sums
// added in order), whatever the thread split, tile, row group or batch size: results do not depend on B or on the
// number of threads. The order differs from gemv.h's (fp32 rounding only). 2-core Zen 3, Q4_K 8192 x 2048:
// ~100-130 GFLOP/s at 16-128 tokens against gemv.h's ~58 (benchmarks/block_gemm.py, RESULTS.md).

#pragma once

#include <algorithm>
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
    parallel_chunks(tiles, B * K >= PACK_SPLIT ? 1 : tiles, [&](int64_t t0, int64_t t1) {
      for (int64_t tile = t0; tile < t1; ++tile) {
        float* dst = t + tile * K * GEMM_NT;
        const int64_t b0 = tile * GEMM_NT, lanes = std::min(GEMM_NT, B - b0);
        const float* src = x + b0 * K;
        int64_t k = 0;
#if defined(SCRATCHLM_AVX512)
        for (; k + 16 <= K; k += 16) {  // 16 tokens x 16 columns through a register transpose: whole lines
          __m512 v[16];
          for (int64_t l = 0; l < 16; ++l) v[l] = l < lanes ? _mm512_loadu_ps(src + l * K + k) : _mm512_setzero_ps();
          transpose16(v);
          for (int i = 0; i < 16; ++i) _mm512_store_ps(dst + (k + i) * GEMM_NT, v[i]);
        }
#endif
        for (; k < K; ++k) {
          float* line = dst + k * GEMM_NT;
          for (int64_t l = 0; l < lanes; ++l) line[l] = src[l * K + k];
          for (int64_t l = lanes; l < GEMM_NT; ++l) line[l] = 0.0f;
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

// `rows` rows of W from w (row_bytes apart), columns [k0, k0 + kc), widened into out (rows x kc, ld GEMM_KC).
template <typename Block>
inline void widen_slice(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k0, int64_t kc, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* blk = w + r * row_bytes + k0 / Block::QK * Block::BYTES;
    for (int64_t i = 0; i < kc / Block::QK; ++i)
      widen_block<Block>(blk + i * Block::BYTES, out + r * GEMM_KC + i * Block::QK);
  }
}

// The sums scratch of one row block of `rows` rows (groups of R, 16-token tiles, R, 16), room made for a block
// of up to max_rows rows and this block's groups zeroed: the micro-kernels add each slice's sums into it.
template <int R>
inline float* zeroed_sums(FloatBuf& acc, int64_t max_rows, int64_t rows, int64_t tiles) {
  if (acc.size() < static_cast<size_t>(max_rows * tiles * 16)) acc.resize(max_rows * tiles * 16);
  std::fill(acc.begin(), acc.begin() + (rows + R - 1) / R * R * tiles * 16, 0.0f);
  return acc.data();
}

// One row block's sums, laid out (row group of R, 16-token tile, R, 16), into y[b * ldy + n + r] for r < rows,
// b < B, then fin(b, n, n + rows) on each token's new values (the caller's scale / bias / residual, while they are
// in L1). Token by token, 16 rows at a time through a register transpose: each token's values are whole runs of
// y's lines. Group by group instead wrote 48-byte pieces of 16 token rows ldy apart, rows that share L1 sets when
// ldy is a multiple of 1024 floats (1B prompt: ~3.4% of its samples against ~1.5%, standalone +1-2.5%).
static_assert(GEMM_NT == 16, "store_block and a8_gemm.h's tiles are 16 tokens");
template <int R, typename Fin>
inline void store_block(const float* acc, int64_t rows, int64_t tiles, int64_t B, float* y, int64_t ldy, int64_t n,
                        const Fin& fin) {
  auto sum = [&](int64_t r, int64_t j) { return acc + ((r / R) * tiles + j) * R * 16 + (r % R) * 16; };
  for (int64_t j = 0; j < tiles; ++j) {
    const int64_t lanes = std::min<int64_t>(16, B - j * 16);
    int64_t r0 = 0;
#if defined(SCRATCHLM_AVX512)
    for (; r0 + 16 <= rows; r0 += 16) {
      __m512 v[16];
      for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_ps(sum(r0 + i, j));
      transpose16(v);
      for (int64_t l = 0; l < lanes; ++l) _mm512_storeu_ps(y + (j * 16 + l) * ldy + n + r0, v[l]);
    }
#endif
    for (int64_t l = 0; l < lanes; ++l) {
      float* yb = y + (j * 16 + l) * ldy + n;
      for (int64_t r = r0; r < rows; ++r) yb[r] = sum(r, j)[l];
      fin(j * 16 + l, n, n + rows);
    }
  }
}

// y[b * ldy + n] = x[b] . W[n] for n in [n0, n1), every b < xp.B (W: N rows of K values in Block), then
// fin(b, lo, hi) on y[b * ldy + lo .. hi) as each row block's values land (store_block).
template <typename Block, typename Fin>
void gemm_block_rows(const PackedX& xp, const uint8_t* w, float* y, int64_t ldy, int64_t n0, int64_t n1,
                     const Fin& fin) {
  const int64_t K = xp.K, tiles = xp.tiles, rows = n1 - n0;
  const int64_t row_bytes = K / Block::QK * Block::BYTES;
  // one row group's slice widened (12 KB on AVX-512): written just before its micro-kernels read it, it stays in L1
  // (a whole 96-row slice widened at once, 96 KB, went out to L2 and back: 1B-shaped Q4_K 128 tokens +2-3.5%)
  alignas(64) thread_local float wg[GEMM_R * GEMM_KC];
  thread_local FloatBuf acc;  // one row block's (row group, tile, R, NT) partial sums (48 KB at 128 tokens)
  auto prefetch_group = [&](int64_t m0, int64_t g, int64_t k0) {  // group g of row block m0, slice k0 (or the next)
    if (g >= std::min(GEMM_MC, rows - m0)) g = 0, k0 += GEMM_KC;
    if (k0 >= K) k0 = 0, m0 += GEMM_MC;
    if (m0 >= rows) return;
    const int64_t nr = std::min<int64_t>(GEMM_R, rows - m0 - g), nb = std::min(GEMM_KC, K - k0) / Block::QK * Block::BYTES;
    const uint8_t* p = w + (n0 + m0 + g) * row_bytes + k0 / Block::QK * Block::BYTES;
    for (int64_t q = 0; q < nr; ++q)
      for (int64_t b = 0; b < nb; b += 64) __builtin_prefetch(p + q * row_bytes + b, 0, 2);
  };
  for (int64_t m0 = 0; m0 < rows; m0 += GEMM_MC) {
    const int64_t mc = std::min(GEMM_MC, rows - m0);
    float* sums = zeroed_sums<GEMM_R>(acc, GEMM_MC, mc, tiles);
    for (int64_t k0 = 0; k0 < K; k0 += GEMM_KC) {
      const int64_t kc = std::min(GEMM_KC, K - k0);
      for (int64_t g = 0; g < mc; g += GEMM_R) {
        const int r = static_cast<int>(std::min<int64_t>(GEMM_R, mc - g));
        widen_slice<Block>(w + (n0 + m0 + g) * row_bytes, row_bytes, r, k0, kc, wg);
        prefetch_group(m0, g + GEMM_R, k0);  // the next group's bytes (rows row_bytes apart: not a stream the
                                             // hardware prefetcher follows) while this one's micro-kernels run
        for (int64_t j = 0; j < tiles; ++j) {
          const float* xt = xp.t + (j * K + k0) * GEMM_NT;
          float* c = sums + ((g / GEMM_R) * tiles + j) * GEMM_R * GEMM_NT;
#if defined(SCRATCHLM_AVX512)
          if (j + 1 < tiles) {  // two tiles at once
            if (kc == GEMM_KC)
              gemm_micro2_rows<GEMM_KC>(r, wg, GEMM_KC, xt, xt + K * GEMM_NT, kc, c, c + GEMM_R * GEMM_NT);
            else
              gemm_micro2_rows<0>(r, wg, GEMM_KC, xt, xt + K * GEMM_NT, kc, c, c + GEMM_R * GEMM_NT);
            ++j;
            continue;
          }
#endif
          if (kc == GEMM_KC)  // a known trip count: ~1.4x the loop on a runtime one (2-core Zen 3)
            gemm_micro_rows<GEMM_KC>(r, wg, GEMM_KC, xt, kc, c);
          else
            gemm_micro_rows<0>(r, wg, GEMM_KC, xt, kc, c);
        }
      }
    }
    store_block<GEMM_R>(sums, mc, tiles, xp.B, y, ldy, n0 + m0, fin);
  }
}

}  // namespace scratchlm
