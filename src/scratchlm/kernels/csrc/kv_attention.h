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

// a . b over n floats (16-lane partial sums, simd.h: a scalar fp32 loop is one long dependency chain the
// compiler may not reorder).
inline float dot_product(const float* a, const float* b, int64_t n) {
  int64_t j = 0;
  VF acc0 = vzero(), acc1 = vzero();
  for (; j + 32 <= n; j += 32) {
    acc0 = vfma(vload(a + j), vload(b + j), acc0);
    acc1 = vfma(vload(a + j + 16), vload(b + j + 16), acc1);
  }
  for (; j + 16 <= n; j += 16) acc0 = vfma(vload(a + j), vload(b + j), acc0);
  float tail = vsum(vadd(acc0, acc1));
  for (; j < n; ++j) tail += a[j] * b[j];
  return tail;
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
  bool hidden(int64_t b, int64_t t) const { return mask && !mask[b * SC + t]; }
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
  bool hidden(int64_t, int64_t) const { return false; }
};

// att (B * C, H * Hd) = softmax(q k^T) v for every row b and chunk token c of layer l: token (b, c) sits at slot
// S - 1 = kv.start(b) + c and attends over slots [lo, S) (causal within the chunk), lo = S - W for a sliding
// window W (else 0), minus the slots kv hides (padding).
// Work items are (token, KV head, span of keys): the G query heads of a KV head read each cached key and value
// once (at long contexts the K/V reads are the step's largest stream: reading them once per query head tripled
// it for G = 3), and a long span is split so every thread has work even with one or two KV heads. Each item
// keeps, per query head, its span's max m, sum l = sum_t exp(s_t - m) and o = sum_t exp(s_t - m) v_t; the
// spans then merge as out = sum_i o_i exp(m_i - M) / sum_i l_i exp(m_i - M), M = max_i m_i.
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
