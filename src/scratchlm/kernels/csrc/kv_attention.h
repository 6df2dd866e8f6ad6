// The decode step's attention over cached keys and values (llama_step.h's LlamaStep calls it per layer):
// where the K/V live (a contiguous KVCache or a block pool's tables) and softmax(q k^T) v over them.

#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "parallel.h"
#include "simd.h"
#include "softmax_exp.h"

namespace scratchlm {

constexpr int64_t KEY_SPAN_MIN = 256;  // cached keys per attention work item at least (attend_kv)
constexpr int64_t KV_AHEAD = 4;        // keys / values read ahead (prefetched) in attend_kv's loops: a block pool's
                                       // rows are KvH * Hd floats apart and its blocks scattered, which the
                                       // hardware prefetcher does not follow (the paged step spent 2.6x the
                                       // contiguous one's time in attention at ~200 cached tokens)

// Every cache line of the n floats at p, on their way to L1
inline void prefetch_row(const float* p, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) prefetch(p + j);
}

// Where layer l's K/V live, token slot t of batch row b, KV head h (Hd floats each), two ways:
// ContiguousKV  the KVCache (L, B, KvH, T_max, Hd): every row's chunk starts at slot s; key_mask (B, s + C)
//               hides padded slots.
// PagedKV       a block pool (L, N, bs, KvH, Hd) (nn/paged_kv_cache.py): row b's slot t is row t % bs of block
//               tables[b, t / bs]; its chunk starts at slot lengths[b] (the tokens it holds); nothing hidden.
struct ContiguousKV {
  float *k, *v;
  int64_t lstride, bstride, T, Hd, s, SC;
  const bool* mask;
  int64_t offset(int64_t l, int64_t b, int64_t h, int64_t t) const { return l * lstride + b * bstride + (h * T + t) * Hd; }
  // out[i] = offset(l, b, h, t0 + i) for t0 + i < t1
  void offsets(int64_t l, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t* out) const {
    for (int64_t t = t0, o = offset(l, b, h, t0); t < t1; ++t, o += Hd) out[t - t0] = o;
  }
  int64_t start(int64_t) const { return s; }
  // the same cache with every row's next token d slots later (a chunk's last token: d = C - 1)
  ContiguousKV shifted(int64_t d, int64_t, std::vector<int64_t>&) const {
    ContiguousKV o = *this;
    o.s += d;
    return o;
  }
  bool hidden(int64_t b, int64_t t) const { return mask && !mask[b * SC + t]; }
  bool any_hidden() const { return mask != nullptr; }
};

struct PagedKV {
  float *k, *v;
  const int64_t *tables, *lengths;
  int64_t M, bs, KvH, Hd, lstride;
  int64_t offset(int64_t l, int64_t b, int64_t h, int64_t t) const {
    return l * lstride + ((tables[b * M + t / bs] * bs + t % bs) * KvH + h) * Hd;
  }
  // out[i] = offset(l, b, h, t0 + i) for t0 + i < t1, one table lookup per block
  void offsets(int64_t l, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t* out) const {
    for (int64_t t = t0; t < t1;) {
      const int64_t n = std::min(bs - t % bs, t1 - t), o = offset(l, b, h, t);  // the rest of t's block
      for (int64_t j = 0; j < n; ++j) out[t - t0 + j] = o + j * KvH * Hd;
      t += n;
    }
  }
  int64_t start(int64_t b) const { return lengths[b]; }
  // the same pool with each of the B rows' next token d slots later (lengths + d, held in store)
  PagedKV shifted(int64_t d, int64_t B, std::vector<int64_t>& store) const {
    store.resize(B);
    for (int64_t b = 0; b < B; ++b) store[b] = lengths[b] + d;
    PagedKV o = *this;
    o.lengths = store.data();
    return o;
  }
  bool hidden(int64_t, int64_t) const { return false; }
  bool any_hidden() const { return false; }
};

#if defined(SCRATCHLM_AVX512)
// The lane sums of v[0..15] as one vector, in v's order: a transpose-add tree (45 shuffles and adds for 16 dot
// products, where 16 separate reductions take ~8 each); the last permute undoes the tree's lane order.
inline __m512 sum16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xee));
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xdd));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), d);
}

// s[i] = q . key i for the n keys at base + at[i] (16 H16 floats each), 16 keys at a time; `ahead`: prefetch the
// keys KV_AHEAD on (the first pass over a span, when they come from memory)
template <int H16>
inline void key_dots(const float* q, const float* base, const int64_t* at, int64_t n, float* s, bool ahead) {
  __m512 qv[H16];
  for (int c = 0; c < H16; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  auto dot = [&](int64_t i) {
    const float* key = base + at[i];
    if (ahead && i + KV_AHEAD < n) prefetch_row(base + at[i + KV_AHEAD], 16 * H16);
    __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(key));
    for (int c = 1; c < H16; ++c) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(key + 16 * c), a);
    return a;
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = dot(i + j);
    _mm512_storeu_ps(s + i, sum16(acc));
  }
  for (; i < n; ++i) s[i] = _mm512_reduce_add_ps(dot(i));
}

// o (16 H16 floats) += sum_i w[i] value i for the n values at base + at[i]; two accumulator sets (FMA latency)
template <int H16>
inline void value_sums(const float* w, const float* base, const int64_t* at, int64_t n, float* o) {
  constexpr int SETS = H16 <= 8 ? 2 : 1;
  __m512 acc[SETS][H16];
  for (int c = 0; c < H16; ++c) {
    acc[0][c] = _mm512_loadu_ps(o + 16 * c);
    if constexpr (SETS == 2) acc[1][c] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + SETS <= n; i += SETS)
    for (int u = 0; u < SETS; ++u) {
      const __m512 wi = _mm512_set1_ps(w[i + u]);
      const float* v = base + at[i + u];
      for (int c = 0; c < H16; ++c) acc[u][c] = _mm512_fmadd_ps(wi, _mm512_loadu_ps(v + 16 * c), acc[u][c]);
    }
  for (; i < n; ++i) {
    const __m512 wi = _mm512_set1_ps(w[i]);
    for (int c = 0; c < H16; ++c) acc[0][c] = _mm512_fmadd_ps(wi, _mm512_loadu_ps(base + at[i] + 16 * c), acc[0][c]);
  }
  for (int c = 0; c < H16; ++c) {
    if constexpr (SETS == 2) acc[0][c] = _mm512_add_ps(acc[0][c], acc[1][c]);
    _mm512_storeu_ps(o + 16 * c, acc[0][c]);
  }
}

// largest of p[0..n)
inline float max_of(const float* p, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(p + i));
  float mx = _mm512_reduce_max_ps(m);
  for (; i < n; ++i) mx = std::max(mx, p[i]);
  return mx;
}

// One work item of attend_kv with Hd = 16 H16: the scores of the n keys at at[] for each of the G heads (p, G rows
// of `width`), their softmax weights, and o_g = sum weight * value. Keys and values are taken in blocks of ~32 KB,
// each block read from memory once and then from L1 / L2 for the other heads.
template <int H16, typename KV>
inline void attend_heads(const float* q, const KV& kv, const int64_t* at, int64_t n, int64_t b, int64_t t0,
                         int64_t G, int64_t width, float attn_softcap, float* p, float* mi, float* li, float* oi) {
  const float NEG = -std::numeric_limits<float>::infinity();
  constexpr int64_t KB = std::max<int64_t>(16, 512 / H16 / 16 * 16);  // keys per block: 32 KB of fp32 keys
  for (int64_t k0 = 0; k0 < n; k0 += KB)
    for (int64_t g = 0; g < G; ++g)
      key_dots<H16>(q + g * 16 * H16, kv.k, at + k0, std::min(KB, n - k0), p + g * width + k0, g == 0);
  for (int64_t g = 0; g < G; ++g) {
    float* pg = p + g * width;
    if (attn_softcap > 0 || kv.any_hidden())
      for (int64_t t = 0; t < n; ++t) {
        if (attn_softcap > 0) pg[t] = std::tanh(pg[t] / attn_softcap) * attn_softcap;
        if (kv.hidden(b, t0 + t)) pg[t] = NEG;
      }
    mi[g] = n > 0 ? max_of(pg, n) : NEG;
    if (mi[g] != NEG) li[g] = exp_sum(pg, n, mi[g]);
  }
  for (int64_t k0 = 0; k0 < n; k0 += KB)
    for (int64_t g = 0; g < G; ++g)  // a head with nothing visible keeps o = 0
      if (mi[g] != NEG) value_sums<H16>(p + g * width + k0, kv.v, at + k0, std::min(KB, n - k0), oi + g * 16 * H16);
}
#endif

// att (B * C, H * Hd) = softmax(q k^T) v for every row b and chunk token c of layer l: token (b, c) sits at slot
// S - 1 = kv.start(b) + c and attends over slots [lo, S) (causal within the chunk), lo = S - W for a sliding
// window W (else 0), minus the slots kv hides (padding).
// Work items are (token, KV head, span of keys): the G query heads of a KV head read each cached key and value
// once (at long contexts the K/V reads are the step's largest stream: reading them once per query head tripled
// it for G = 3), and a long span is split so every thread has work even with one or two KV heads. Each item
// keeps, per query head, its span's max m, sum l = sum_t exp(s_t - m) and o = sum_t exp(s_t - m) v_t; the
// spans then merge as out = sum_i o_i exp(m_i - M) / sum_i l_i exp(m_i - M), M = max_i m_i. On AVX-512 with Hd a
// multiple of 16 (up to 256) an item runs attend_heads: head by head over ~32 KB blocks of keys (one read from
// memory per block), 16 keys' dot products summed at once (sum16); elsewhere the scalar-per-key loops below.
template <typename KV>
void attend_kv(const float* q, const KV& kv, int64_t l, float* att, int64_t B, int64_t C, int64_t window, int64_t H,
               int64_t KvH, int64_t Hd, float attn_softcap) {
  const int64_t G = H / KvH, R = B * C;
  const float NEG = -std::numeric_limits<float>::infinity();
  auto span = [&](int64_t r, int64_t& lo, int64_t& S) {
    S = kv.start(r / C) + r % C + 1;
    lo = window < 0 ? 0 : std::max<int64_t>(0, S - window);
  };
  int64_t longest = 1;
  for (int64_t r = 0; r < R; ++r) {
    int64_t lo, S;
    span(r, lo, S);
    longest = std::max(longest, S - lo);
  }
  // keys per item: at least KEY_SPAN_MIN, and enough items for twice the threads when the spans are long
  const int64_t threads = at::get_num_threads(), base = R * KvH;
  const int64_t want = base >= 2 * threads ? 1 : (2 * threads + base - 1) / base;
  const int64_t width = std::max<int64_t>(KEY_SPAN_MIN, (longest + want - 1) / want);
  const int64_t spans = (longest + width - 1) / width;
  std::vector<float> m(base * spans * G), lsum(base * spans * G), o(base * spans * G * Hd);
  parallel_chunks(base * spans, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> p;      // scores, then weights, of the G heads over the span
    thread_local std::vector<int64_t> at;   // where each key / value of the span is
    p.resize(G * width), at.resize(width);  // (one item per chunk: kept per thread, not allocated per item)
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / (KvH * spans), kh = (i / spans) % KvH, part = i % spans, b = r / C;
      int64_t lo, S;
      span(r, lo, S);
      const int64_t t0 = lo + part * width, t1 = std::min(S, t0 + width), n = std::max<int64_t>(0, t1 - t0);
      float* mi = &m[i * G];
      float* li = &lsum[i * G];
      float* oi = &o[i * G * Hd];
      std::fill(oi, oi + G * Hd, 0.f);
      for (int64_t g = 0; g < G; ++g) mi[g] = NEG, li[g] = 0.f;
      kv.offsets(l, b, kh, t0, t1, at.data());
#if defined(SCRATCHLM_AVX512)
      if (Hd % 16 == 0 && Hd <= 256) {  // head by head, 16 keys' dot products at once
        const float* qh = q + (r * H + kh * G) * Hd;
        switch (Hd / 16) {
#define SCRATCHLM_HEADS(h16) \
  case h16: attend_heads<h16>(qh, kv, at.data(), n, b, t0, G, width, attn_softcap, p.data(), mi, li, oi); break;
          SCRATCHLM_HEADS(1) SCRATCHLM_HEADS(2) SCRATCHLM_HEADS(3) SCRATCHLM_HEADS(4) SCRATCHLM_HEADS(5)
          SCRATCHLM_HEADS(6) SCRATCHLM_HEADS(7) SCRATCHLM_HEADS(8) SCRATCHLM_HEADS(9) SCRATCHLM_HEADS(10)
          SCRATCHLM_HEADS(11) SCRATCHLM_HEADS(12) SCRATCHLM_HEADS(13) SCRATCHLM_HEADS(14) SCRATCHLM_HEADS(15)
          SCRATCHLM_HEADS(16)
#undef SCRATCHLM_HEADS
        }
        continue;
      }
#endif
      for (int64_t t = t0; t < t1; ++t) {  // scores of the G heads against key t (read once)
        if (t + KV_AHEAD < t1) prefetch_row(kv.k + at[t + KV_AHEAD - t0], Hd);
        const float* key = kv.k + at[t - t0];
        const bool hid = kv.hidden(b, t);
        for (int64_t g = 0; g < G; ++g) {
          float dot = dot_product(q + (r * H + kh * G + g) * Hd, key, Hd);
          if (attn_softcap > 0) dot = std::tanh(dot / attn_softcap) * attn_softcap;
          p[g * width + t - t0] = hid ? NEG : dot;
          mi[g] = std::max(mi[g], p[g * width + t - t0]);
        }
      }
      for (int64_t g = 0; g < G; ++g)
        if (mi[g] != NEG) li[g] = exp_sum(&p[g * width], n, mi[g]);
        else std::fill(&p[g * width], &p[g * width] + n, 0.f);  // nothing visible in this span
      for (int64_t t = t0; t < t1; ++t) {  // o_g += exp(s - m) v_t, value t read once
        if (t + KV_AHEAD < t1) prefetch_row(kv.v + at[t + KV_AHEAD - t0], Hd);
        const float* vals = kv.v + at[t - t0];
        for (int64_t g = 0; g < G; ++g) {
          const float w = p[g * width + t - t0];
          float* og = oi + g * Hd;
          for (int64_t j = 0; j < Hd; ++j) og[j] += w * vals[j];
        }
      }
    }
  });
  for (int64_t r = 0; r < R; ++r)  // merge the spans of every (token, head)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / G, g = h % G, first = (r * KvH + kh) * spans;
      float M = NEG;
      for (int64_t part = 0; part < spans; ++part) M = std::max(M, m[(first + part) * G + g]);
      float* out = att + (r * H + h) * Hd;
      std::fill(out, out + Hd, 0.f);
      if (M == NEG) continue;  // no visible key (a left pad): zeros, as sdpa
      float den = 0.f;
      for (int64_t part = 0; part < spans; ++part) {
        const int64_t i = first + part;
        if (m[i * G + g] == NEG) continue;
        const float scale = std::exp(m[i * G + g] - M);
        den += lsum[i * G + g] * scale;
        const float* oi = &o[(i * G + g) * Hd];
        for (int64_t j = 0; j < Hd; ++j) out[j] += oi[j] * scale;
      }
      for (int64_t j = 0; j < Hd; ++j) out[j] /= den;
    }
}


}  // namespace scratchlm
