// A whole one-token decode step of a pre-norm Llama-family model (RMSNorm, RoPE, GQA, SwiGLU) in C++:
// FastDecoder.step's math (generate/fast_decode.py) without the ~35 Python-dispatched torch ops per
// layer, the matrices in any matrix_ref.h format. Per layer, for every row b of the batch:
//   xn  = x * rsqrt(sum(x^2) / D + eps)                    (the norm gain lives in the next matrix)
//   qkv = Wqkv(xn)                                         (q rows carry 1/sqrt(Hd))
//   [QK-norm] q_h = rms(q_h) g_q, k_h = rms(k_h) g_k       (per head over Hd, or over the whole H Hd / KvH Hd
//                                                          projection; 1/sqrt(Hd) then lives in g_q: Qwen3, OLMo-2)
//   q, k = q * cos + rot(q) * sin, k likewise              (rot: (a, b) -> (-b, a) over the style's pairs)
//   cache[l, b, :, s] = k, v
//   a_h = softmax_t(q_h . k_t + mask_t) v_t  over slots t <= s, KV head h / G (GQA)
//   x = x + Wo(a);  xn = norm(x);  [g | u] = Wgu(xn);  x = x + Wdown(silu(g) * u)
// then logits = Whead(norm(x)). `chunk` runs C tokens per row at once (a prompt's next tokens, causal within
// the chunk); `step` is its one-token case; `paged` runs a chunk over a block pool's tables (the server's K/V,
// each row at its own length). Each `Linear` is y = ((x * in_scale) W^T) * out_scale + bias, exactly as the
// PackedLinear it mirrors.

#pragma once

#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "linear.h"

namespace scratchlm {

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
  int64_t start(int64_t b) const { return lengths[b]; }
  bool hidden(int64_t, int64_t) const { return false; }
};

struct LlamaStep {
  torch::Tensor embed, cos, sin;  // embed (V, D) fp32, or (V, row bytes) uint8 in embed_format; cos, sin (T_max, Hd)
  int embed_format;               // matrix_ref.h's Format of the embedding table (F32: a plain fp32 table)
  int64_t V, D;                   // the table's rows and width
  int64_t H, KvH, Hd;
  float eps;
  bool half_style;
  std::vector<std::vector<Linear>> layers;  // per layer: qkv, o, gate|up, down
  Linear head;
  std::vector<int64_t> windows;  // per layer: sliding window W (attend slots [S - W, S)), or -1
  std::vector<torch::Tensor> qk_gains;  // per layer: fp32 (H + KvH, Hd) QK-norm gains, or empty (no QK-norm)
  bool qk_projection;                   // QK-norm over the whole q / k projection instead of each head

  LlamaStep(torch::Tensor embed_, int64_t embed_format_, int64_t D_, torch::Tensor cos_, torch::Tensor sin_,
            int64_t H_, int64_t KvH_, int64_t Hd_, double eps_, bool half_, std::vector<std::vector<Linear>> layers_,
            Linear head_, std::vector<int64_t> windows_, std::vector<torch::Tensor> qk_gains_, bool qk_projection_)
      : embed(embed_.contiguous()), cos(cos_.contiguous()), sin(sin_.contiguous()),
        embed_format(static_cast<int>(embed_format_)), V(embed_.size(0)), D(D_), H(H_), KvH(KvH_), Hd(Hd_),
        eps(static_cast<float>(eps_)), half_style(half_), layers(std::move(layers_)), head(std::move(head_)),
        windows(std::move(windows_)), qk_gains(std::move(qk_gains_)), qk_projection(qk_projection_) {
    TORCH_CHECK(cos.scalar_type() == torch::kFloat32, "fp32 RoPE tables expected");
    if (embed_format == F32) {
      TORCH_CHECK(embed.scalar_type() == torch::kFloat32 && embed.dim() == 2 && embed.size(1) == D,
                  "an F32 embedding table must be fp32 (V, D)");
    } else {
      const MatrixRef row_ref{embed_format, nullptr, 1, D, nullptr, nullptr};
      const int64_t row_bytes = row_ref.row_bytes();
      TORCH_CHECK(embed.scalar_type() == torch::kUInt8 && embed.dim() == 2 && embed.size(1) == row_bytes,
                  "a block embedding table must be uint8 (V, row bytes of its format)");
    }
    TORCH_CHECK(windows.size() == layers.size(), "one window (or -1) per layer");
    TORCH_CHECK(qk_gains.size() == layers.size(), "one QK-norm gain tensor (or an empty one) per layer");
    for (auto& g : qk_gains) {
      if (g.numel() == 0) continue;
      g = g.to(torch::kFloat32).contiguous();
      TORCH_CHECK(g.dim() == 2 && g.size(0) == H + KvH && g.size(1) == Hd, "QK-norm gains must be (H + KvH, Hd)");
    }
    TORCH_CHECK(cos.dim() == 2 && cos.size(1) == Hd && sin.sizes() == cos.sizes(), "cos/sin must be (T_max, Hd)");
    for (const auto& l : layers) TORCH_CHECK(l.size() == 4, "a layer is (qkv, o, gate|up, down)");
  }

  // Row `id` of the embedding table as fp32 (D): copied from an fp32 table, or widened exactly from its
  // storage (bf16 bits << 16, the f16 half, or the ggml blocks of the row) like every matrix here.
  void embed_row(int64_t id, float* out) const {
    const uint8_t* row = static_cast<const uint8_t*>(embed.data_ptr()) + id * embed.stride(0) * embed.element_size();
    if (embed_format == F32) {
      std::memcpy(out, row, D * sizeof(float));
    } else if (embed_format == BF16) {
      for (int64_t j = 0; j < D; ++j) {
        const uint32_t bits = static_cast<uint32_t>(row[2 * j] | (row[2 * j + 1] << 8)) << 16;
        std::memcpy(&out[j], &bits, 4);
      }
    } else if (embed_format == F16) {
      for (int64_t j = 0; j < D; ++j) out[j] = fp16_to_f32(row + 2 * j);
    } else {
      const MatrixRef row_ref{embed_format, row, 1, D, nullptr, nullptr};
      row_ref.dequantize(out);
    }
  }

  void rms(const float* x, float* out, int64_t B, int64_t D) const {
    for (int64_t b = 0; b < B; ++b) {
      const float ss = dot_product(x + b * D, x + b * D, D);
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) out[b * D + i] = x[b * D + i] * r;
    }
  }

  // QK-norm of one token's q and k heads (row: (H + KvH) x Hd, q heads first) with layer l's gains g:
  // v <- v * rsqrt(sum(v^2) / n + eps) * g over each head (n = Hd), or over all q heads and all k heads at once.
  void qk_norm(float* row, int64_t l) const {
    const float* g = qk_gains[l].data_ptr<float>();
    auto norm = [&](float* v, const float* gain, int64_t n) {
      const float r = 1.0f / std::sqrt(dot_product(v, v, n) / static_cast<float>(n) + eps);
      for (int64_t j = 0; j < n; ++j) v[j] = v[j] * r * gain[j];
    };
    if (qk_projection) {
      norm(row, g, H * Hd);
      norm(row + H * Hd, g + H * Hd, KvH * Hd);
    } else {
      for (int64_t h = 0; h < H + KvH; ++h) norm(row + h * Hd, g + h * Hd, Hd);
    }
  }

  // v (Hd) <- v * cos + rot(v) * sin at one position.
  void rope(float* v, const float* c, const float* s, float* tmp) const {
    const int64_t half = Hd / 2;
    for (int64_t j = 0; j < Hd; ++j) {
      float r;
      if (half_style) r = j < half ? -v[j + half] : v[j - half];
      else r = (j % 2 == 0) ? -v[j + 1] : v[j - 1];
      tmp[j] = v[j] * c[j] + r * s[j];
    }
    std::memcpy(v, tmp, Hd * sizeof(float));
  }

  // att (B * C, H * Hd) = softmax(q k^T) v for every row b and chunk token c of layer l: token (b, c) sits at slot
  // S - 1 = kv.start(b) + c and attends over slots [lo, S) (causal within the chunk), lo = S - W for a sliding
  // window W (else 0), minus the slots kv hides (padding).
  template <typename KV>
  void attend(const float* q, const KV& kv, int64_t l, float* att, int64_t B, int64_t C, int64_t window) const {
    const int64_t G = H / KvH;
    at::parallel_for(0, B * C * H, 1, [&](int64_t i0, int64_t i1) {
      std::vector<float> p;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t r = i / H, h = i % H, b = r / C, c = r % C;
        const int64_t S = kv.start(b) + c + 1, lo = window < 0 ? 0 : std::max<int64_t>(0, S - window);
        if (static_cast<int64_t>(p.size()) < S) p.resize(S);
        const float* qh = q + (r * H + h) * Hd;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = lo; t < S; ++t) {
          const float dot = dot_product(qh, kv.k + kv.offset(l, b, h / G, t), Hd);
          p[t] = kv.hidden(b, t) ? -std::numeric_limits<float>::infinity() : dot;
          mx = std::max(mx, p[t]);
        }
        float* out = att + (r * H + h) * Hd;
        std::fill(out, out + Hd, 0.f);
        if (mx == -std::numeric_limits<float>::infinity()) continue;  // no visible key (a left pad): zeros, as sdpa
        float sum = 0.f;
        for (int64_t t = lo; t < S; ++t) sum += (p[t] = std::exp(p[t] - mx));
        for (int64_t t = lo; t < S; ++t) {
          const float w = p[t] / sum;
          const float* vals = kv.v + kv.offset(l, b, h / G, t);
          for (int64_t j = 0; j < Hd; ++j) out[j] += w * vals[j];
        }
      }
    });
  }

  // tokens (B,) int64, positions (B,) int64, key_mask (B, s + 1) bool or None, k/v caches
  // (L, B, KvH, T_max, Hd) fp32, s = the slot to write -> logits (B, V) fp32.
  torch::Tensor step(torch::Tensor tokens, torch::Tensor positions, std::optional<torch::Tensor> key_mask,
                     torch::Tensor kcache, torch::Tensor vcache, int64_t s) const {
    return chunk(tokens.reshape({-1, 1}), positions.reshape({-1, 1}), key_mask, kcache, vcache, s, false);
  }

  // C tokens per row at once (a prompt's next tokens): tokens, positions (B, C) int64, key_mask (B, s + C) bool
  // or None, caches as step's; row b's token c is written at slot s + c and attends causally (see attend)
  // -> logits (B, V) of each row's last token (the head runs on those rows only), or (B * C, V) of every token
  // with all_logits (speculative decoding's verification).
  torch::Tensor chunk(torch::Tensor tokens, torch::Tensor positions, std::optional<torch::Tensor> key_mask,
                      torch::Tensor kcache, torch::Tensor vcache, int64_t s, bool all_logits) const {
    TORCH_CHECK(tokens.dim() == 2 && positions.sizes() == tokens.sizes(), "tokens and positions must be (B, C)");
    const int64_t B = tokens.size(0), C = tokens.size(1), L = static_cast<int64_t>(layers.size());
    const int64_t T = kcache.size(3), SC = s + C;
    TORCH_CHECK(C >= 1, "a chunk needs at least one token per row");
    TORCH_CHECK(kcache.scalar_type() == torch::kFloat32 && vcache.scalar_type() == torch::kFloat32 &&
                    kcache.sizes() == torch::IntArrayRef({L, B, KvH, T, Hd}) && vcache.sizes() == kcache.sizes() &&
                    kcache.strides() == vcache.strides() && kcache.stride(4) == 1 && kcache.stride(3) == Hd &&
                    kcache.stride(2) == T * Hd,
                "the KV caches must be fp32 (L, B, KvH, T_max, Hd), contiguous within a batch row");
    const int64_t lstride = kcache.stride(0), bstride = kcache.stride(1);
    TORCH_CHECK(SC <= T, "KV cache overflow: slots up to ", SC - 1, " >= capacity ", T);
    torch::Tensor mask_t = key_mask.has_value() ? key_mask->to(torch::kBool).contiguous() : torch::Tensor();
    TORCH_CHECK(!mask_t.defined() || mask_t.sizes() == torch::IntArrayRef({B, SC}), "key_mask must be (B, s + C)");
    const bool* mask = mask_t.defined() ? mask_t.data_ptr<bool>() : nullptr;
    const ContiguousKV kv{kcache.data_ptr<float>(), vcache.data_ptr<float>(), lstride, bstride, T, Hd, s, SC, mask};
    return run(tokens, positions, kv, all_logits);
  }

  // The same over a block pool (nn/paged_kv_cache.py's BlockPool): tokens, positions (B, C) int64, lengths (B,)
  // int64 = the tokens row b already holds, tables (B, M) int64 = its blocks in token order (room for
  // lengths[b] + C tokens), k/v pools fp32 (L, N, bs, KvH, Hd). Row b's token c is written at its slot
  // lengths[b] + c and attends over the row's slots up to it -> logits (B, V) of each row's last token, or
  // (B * C, V) of every token with all_logits (speculative decoding's verification of C - 1 draft tokens).
  torch::Tensor paged(torch::Tensor tokens, torch::Tensor positions, torch::Tensor lengths, torch::Tensor tables,
                      torch::Tensor kpool, torch::Tensor vpool, bool all_logits) const {
    TORCH_CHECK(tokens.dim() == 2 && positions.sizes() == tokens.sizes(), "tokens and positions must be (B, C)");
    const int64_t B = tokens.size(0), C = tokens.size(1), L = static_cast<int64_t>(layers.size());
    TORCH_CHECK(C >= 1, "a chunk needs at least one token per row");
    TORCH_CHECK(kpool.scalar_type() == torch::kFloat32 && kpool.dim() == 5 && kpool.size(0) == L &&
                    kpool.size(3) == KvH && kpool.size(4) == Hd && kpool.is_contiguous() &&
                    vpool.sizes() == kpool.sizes() && vpool.is_contiguous() && vpool.scalar_type() == torch::kFloat32,
                "the block pools must be contiguous fp32 (L, N, bs, KvH, Hd)");
    const int64_t N = kpool.size(1), bs = kpool.size(2);
    auto len_t = lengths.to(torch::kInt64).contiguous(), tab_t = tables.to(torch::kInt64).contiguous();
    TORCH_CHECK(len_t.dim() == 1 && len_t.size(0) == B && tab_t.dim() == 2 && tab_t.size(0) == B,
                "lengths must be (B,) and tables (B, M)");
    const int64_t M = tab_t.size(1);
    const int64_t *len = len_t.data_ptr<int64_t>(), *tab = tab_t.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(len[b] >= 0 && len[b] + C <= M * bs, "row ", b, ": ", len[b], " + ", C, " tokens do not fit its ",
                  M, " blocks of ", bs);
      for (int64_t j = 0; j < (len[b] + C + bs - 1) / bs; ++j)
        TORCH_CHECK(tab[b * M + j] >= 0 && tab[b * M + j] < N, "row ", b, ": block id ", tab[b * M + j],
                    " outside the pool's ", N, " blocks");
    }
    const PagedKV kv{kpool.data_ptr<float>(), vpool.data_ptr<float>(), tab, len, M, bs, KvH, Hd, kpool.stride(0)};
    return run(tokens, positions, kv, all_logits);
  }

  // The layers over C tokens per row (tokens, positions (B, C)), K/V stored and read through kv (see attend);
  // the head on each row's last token (B rows), or on every token with all_logits (B * C rows).
  template <typename KV>
  torch::Tensor run(const torch::Tensor& tokens, const torch::Tensor& positions, const KV& kv,
                    bool all_logits = false) const {
    const int64_t B = tokens.size(0), C = tokens.size(1), R = B * C, L = static_cast<int64_t>(layers.size());
    const int64_t QKV = (H + 2 * KvH) * Hd;
    auto tok = tokens.to(torch::kInt64).contiguous(), pos = positions.to(torch::kInt64).contiguous();
    const int64_t* tp = tok.data_ptr<int64_t>();  // row r = b * C + c
    const int64_t* pp = pos.data_ptr<int64_t>();
    std::vector<float> x(R * D), x2(R * D), xn(R * D), qkv(R * QKV), q(R * H * Hd), att(R * H * Hd), scratch, tmp(Hd);
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(tp[r] >= 0 && tp[r] < V, "token id ", tp[r], " out of range");
      TORCH_CHECK(pp[r] >= 0 && pp[r] < cos.size(0), "position ", pp[r], " beyond the RoPE table");
      embed_row(tp[r], &x[r * D]);
    }
    for (int64_t l = 0; l < L; ++l) {
      const auto& lay = layers[l];
      rms(x.data(), xn.data(), R, D);
      lay[0].apply(xn.data(), qkv.data(), R, nullptr, scratch);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t b = r / C, c = r % C;
        const float* cs = cos.data_ptr<float>() + pp[r] * Hd;
        const float* sn = sin.data_ptr<float>() + pp[r] * Hd;
        float* row = &qkv[r * QKV];
        if (qk_gains[l].numel()) qk_norm(row, l);
        for (int64_t h = 0; h < H + KvH; ++h) rope(row + h * Hd, cs, sn, tmp.data());
        for (int64_t h = 0; h < KvH; ++h) {
          const int64_t slot = kv.offset(l, b, h, kv.start(b) + c);
          std::memcpy(kv.k + slot, row + (H + h) * Hd, Hd * sizeof(float));
          std::memcpy(kv.v + slot, row + (H + KvH + h) * Hd, Hd * sizeof(float));
        }
        std::memcpy(&q[r * H * Hd], row, H * Hd * sizeof(float));  // the rotated q heads
      }
      attend(q.data(), kv, l, att.data(), B, C, windows[l]);
      lay[1].apply(att.data(), x2.data(), R, x.data(), scratch);
      std::swap(x, x2);
      rms(x.data(), xn.data(), R, D);
      const int64_t F2 = lay[2].N, F = F2 / 2;
      std::vector<float> gu(R * F2), act(R * F);
      lay[2].apply(xn.data(), gu.data(), R, nullptr, scratch);
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t f = 0; f < F; ++f) {
          const float g = gu[r * F2 + f];
          act[r * F + f] = g / (1.0f + std::exp(-g)) * gu[r * F2 + F + f];
        }
      }
      lay[3].apply(act.data(), x2.data(), R, x.data(), scratch);
      std::swap(x, x2);
    }
    const int64_t out_rows = all_logits ? R : B;
    if (C > 1 && !all_logits)  // each row's last token to the front: the head runs on those B rows only
      for (int64_t b = 0; b < B; ++b) std::memcpy(&x[b * D], &x[(b * C + C - 1) * D], D * sizeof(float));
    rms(x.data(), xn.data(), out_rows, D);
    auto logits = torch::empty({out_rows, head.N}, cos.options());
    head.apply(xn.data(), logits.data_ptr<float>(), out_rows, nullptr, scratch);
    return logits;
  }
};

}  // namespace scratchlm
