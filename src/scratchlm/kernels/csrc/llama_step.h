// A whole one-token decode step of an RMSNorm / RoPE / GQA / gated-FFN model (Llama, Qwen, Mistral, Gemma,
// OLMo-2 and their kin) in C++: FastDecoder.step's math (generate/fast_decode.py) without the ~35
// Python-dispatched torch ops per layer, the matrices in any matrix_ref.h format.
//   x   = embed(token) * embed_scale                       (Gemma: sqrt(D))
// per layer, for every row b of the batch (LayerSpec says which optional parts the layer has):
//   xn  = rms(x) = x * rsqrt(sum(x^2) / D + eps)           (the norm gain lives in the next matrix; xn = x
//                                                          where the block has no input norm: OLMo-2)
//   qkv = Wqkv(xn)                                         (q rows carry the attention scale)
//   [QK-norm] q_h = rms(q_h) g_q, k_h = rms(k_h) g_k       (per head over Hd, or over the whole H Hd / KvH Hd
//                                                          projection; the scale then lives in g_q: Qwen3, OLMo-2)
//   q, k = q * cos + rot(q) * sin, k likewise              (rot: (a, b) -> (-b, a) over the style's pairs; the
//                                                          layer's tables, global or local (Gemma-3), or none: NoPE)
//   cache[l, b, :, s] = k, v
//   a_h = softmax_t(cap(q_h . k_t) + mask_t) v_t  over slots t <= s, KV head h / G (GQA); cap(z) = tanh(z / c) c
//                                                          with an attention softcap c (Gemma-2), else z
//   x = x + Wo(a)                 or  x = x + rms(Wo(a)) g_ao      (an output norm: Gemma-2/3 sandwich, OLMo-2)
//   xn = rms(x);  [g | u] = Wgu(xn);  f = act(g) * u       (act: SiLU, or GELU / its tanh form: Gemma's GeGLU)
//   x = x + Wdown(f)              or  x = x + rms(Wdown(f)) g_fo
//   (a mixture-of-experts layer instead: x = x + MoE(xn), or x + rms(MoE(xn)) g_fo; moe_layer.h)
// then logits = cap_final(Whead(rms(x)) / logits_scaling). `chunk` runs C tokens per row at once (a prompt's next tokens, causal within
// the chunk); `step` is its one-token case; `paged` runs a chunk over a block pool's tables (the server's K/V,
// each row at its own length). Each `Linear` is y = ((x * in_scale) W^T) * out_scale + bias, exactly as the
// PackedLinear it mirrors.

#pragma once

#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "aligned_buffer.h"
#include "gate_activation.h"
#include "kv_attention.h"
#include "linear.h"
#include "moe_layer.h"

namespace scratchlm {

// What one layer has beyond the plain pre-norm Llama block (window, RoPE table, input norm, QK-norm and output
// norm gains: empty tensors where absent).
struct LayerSpec {
  int64_t window;        // sliding window W (attend slots [S - W, S)), or -1
  int64_t rope;          // ROPE_GLOBAL, ROPE_LOCAL or ROPE_NONE
  bool pre_norm;         // rms(x) before the qkv and gate|up matrices (false: they read x itself)
  torch::Tensor qk_gain;        // fp32 (H + KvH, Hd), or empty
  torch::Tensor attn_out_gain;  // fp32 (D,), or empty
  torch::Tensor ffn_out_gain;   // fp32 (D,), or empty
  LayerSpec(int64_t window_, int64_t rope_, bool pre_norm_, torch::Tensor qk_gain_, torch::Tensor attn_out_gain_,
            torch::Tensor ffn_out_gain_)
      : window(window_), rope(rope_), pre_norm(pre_norm_), qk_gain(fp32_or_empty(qk_gain_)),
        attn_out_gain(fp32_or_empty(attn_out_gain_)), ffn_out_gain(fp32_or_empty(ffn_out_gain_)) {}
  static torch::Tensor fp32_or_empty(const torch::Tensor& t) {
    return t.numel() ? t.to(torch::kFloat32).contiguous() : torch::Tensor();
  }
};

constexpr int64_t ROPE_GLOBAL = 0, ROPE_LOCAL = 1, ROPE_NONE = -1;
constexpr int64_t ROWS_SPLIT = 16;  // prompt rows from which the per-row work (norms, RoPE, gate) splits over threads

// LlamaStep::run's work buffers (x, the residual stream; x2 its next value; xn normed; qkv, q, att; gu, f the FFN's)
struct StepBuffers {
  FloatBuf x, x2, xn, qkv, q, att, gu, f;  // on 64-byte lines: their 16-float rows are whole cache lines
  std::vector<float> scratch;
  std::vector<int64_t> starts;  // a paged cache's lengths moved to each row's last token
};

struct LlamaStep {
  torch::Tensor embed, cos, sin;  // embed (V, D) fp32, or (V, row bytes) uint8 in embed_format; cos, sin (T_max, P):
                                  // the first P <= Hd dims of each head rotate (partial rotary: Phi-4-mini)
  int embed_format;               // matrix_ref.h's Format of the embedding table (F32: a plain fp32 table)
  int64_t V, D;                   // the table's rows and width
  int64_t H, KvH, Hd;
  float eps;
  bool half_style;
  std::vector<std::vector<Linear>> layers;  // per layer: qkv, o, gate|up, down (an MoE layer: qkv, o)
  std::vector<MoELayer> moe;                // the MoE layers' FFNs
  std::vector<int64_t> moe_of;              // per layer: its index in moe, or -1 (a dense FFN); empty: all dense
  Linear head;
  std::vector<LayerSpec> specs;  // per layer
  bool qk_projection;            // QK-norm over the whole q / k projection instead of each head
  torch::Tensor cos_local, sin_local;  // the sliding layers' RoPE tables (Gemma-3), or empty
  torch::Tensor cos_long, sin_long;    // longrope's long-context tables (Phi-3.5 / Phi-4-mini), or empty: a call
  int64_t long_after;                  // whose positions reach past long_after (L0) uses them for every row
  int64_t act;                   // the gate's activation: ACT_SILU, ACT_GELU or ACT_GELU_TANH
  float embed_scale, attn_softcap, final_softcap, logits_scaling;  // softcaps <= 0: none

  LlamaStep(torch::Tensor embed_, int64_t embed_format_, int64_t D_, torch::Tensor cos_, torch::Tensor sin_,
            int64_t H_, int64_t KvH_, int64_t Hd_, double eps_, bool half_, std::vector<std::vector<Linear>> layers_,
            Linear head_, std::vector<LayerSpec> specs_, bool qk_projection_, torch::Tensor cos_local_,
            torch::Tensor sin_local_, torch::Tensor cos_long_, torch::Tensor sin_long_, int64_t long_after_,
            int64_t act_, double embed_scale_, double attn_softcap_, double final_softcap_, double logits_scaling_,
            std::vector<MoELayer> moe_ = {}, std::vector<int64_t> moe_of_ = {})
      : embed(embed_.contiguous()), cos(cos_.contiguous()), sin(sin_.contiguous()),
        embed_format(static_cast<int>(embed_format_)), V(embed_.size(0)), D(D_), H(H_), KvH(KvH_), Hd(Hd_),
        eps(static_cast<float>(eps_)), half_style(half_), layers(std::move(layers_)), head(std::move(head_)),
        specs(std::move(specs_)), qk_projection(qk_projection_), cos_local(cos_local_.contiguous()),
        sin_local(sin_local_.contiguous()), cos_long(cos_long_.contiguous()), sin_long(sin_long_.contiguous()),
        long_after(long_after_), act(act_), embed_scale(static_cast<float>(embed_scale_)),
        attn_softcap(static_cast<float>(attn_softcap_)), final_softcap(static_cast<float>(final_softcap_)),
        logits_scaling(static_cast<float>(logits_scaling_)) {
    moe = std::move(moe_);
    moe_of = moe_of_.empty() ? std::vector<int64_t>(layers.size(), -1) : std::move(moe_of_);
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
    TORCH_CHECK(specs.size() == layers.size(), "one LayerSpec per layer");
    TORCH_CHECK(act == ACT_SILU || act == ACT_GELU || act == ACT_GELU_TANH, "unknown activation code ", act);
    for (const auto& sp : specs) {
      TORCH_CHECK(!sp.qk_gain.defined() || (sp.qk_gain.dim() == 2 && sp.qk_gain.size(0) == H + KvH &&
                                            sp.qk_gain.size(1) == Hd), "QK-norm gains must be (H + KvH, Hd)");
      for (const auto* g : {&sp.attn_out_gain, &sp.ffn_out_gain})
        TORCH_CHECK(!g->defined() || (g->dim() == 1 && g->size(0) == D), "output-norm gains must be (D,)");
      TORCH_CHECK(sp.rope == ROPE_GLOBAL || sp.rope == ROPE_NONE ||
                      (sp.rope == ROPE_LOCAL && cos_local.dim() == 2 && cos_local.sizes() == cos.sizes() &&
                       sin_local.sizes() == cos.sizes() && cos_local.scalar_type() == torch::kFloat32),
                  "a local-RoPE layer needs fp32 local tables shaped like the global ones");
    }
    TORCH_CHECK(cos.dim() == 2 && cos.size(1) <= Hd && cos.size(1) % 2 == 0 && sin.sizes() == cos.sizes(),
                "cos/sin must be (T_max, P), P <= Hd even");
    TORCH_CHECK(long_after < 0 || (cos_long.sizes() == cos.sizes() && sin_long.sizes() == cos.sizes() &&
                                   cos_long.scalar_type() == torch::kFloat32),
                "longrope's long tables must be fp32 and shaped like the short ones");
    TORCH_CHECK(moe_of.size() == layers.size(), "one MoE index (or -1) per layer");
    for (size_t i = 0; i < layers.size(); ++i) {
      const int64_t m = moe_of[i];
      TORCH_CHECK(m >= -1 && m < static_cast<int64_t>(moe.size()), "layer ", i, ": MoE index ", m, " out of range");
      TORCH_CHECK(layers[i].size() == (m >= 0 ? 2u : 4u), "a layer is (qkv, o, gate|up, down), an MoE layer (qkv, o)");
      TORCH_CHECK(m < 0 || moe[m].router.K == D, "layer ", i, ": the router must read D = ", D, " values");
    }
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

  // fn(r0, r1) over the rows [0, R) of a prompt chunk, split over the threads from ROWS_SPLIT rows (each row's
  // work is independent of the split: the same results on any number of threads); one call on this thread below.
  template <typename Fn>
  static void each_row_chunk(int64_t R, const Fn& fn) {
    parallel_chunks(R, R >= ROWS_SPLIT ? std::max<int64_t>(4, R / 8) : R, fn);
  }
  template <typename Fn>
  static void each_row(int64_t R, const Fn& fn) {
    each_row_chunk(R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) fn(r);
    });
  }

  void rms(const float* x, float* out, int64_t B, int64_t D) const {
    each_row(B, [&](int64_t b) {
      const float ss = dot_product(x + b * D, x + b * D, D);
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) out[b * D + i] = x[b * D + i] * r;
    });
  }

  // x (R, D) <- x + W(in), or x + rms(W(in)) * gain with an output norm (its gain defined); x2 is scratch.
  void residual(const Linear& w, const float* in, const torch::Tensor& gain, FloatBuf& x, FloatBuf& x2, int64_t R,
                std::vector<float>& scratch) const {
    if (!gain.defined()) {  // the matrix adds the residual itself
      w.apply(in, x2.data(), R, x.data(), scratch);
      std::swap(x, x2);
      return;
    }
    w.apply(in, x2.data(), R, nullptr, scratch);
    add_output(x2.data(), gain, x.data(), R);
  }

  // x (R, D) += y, or += rms(y) * gain with an output norm (gain defined)
  void add_output(const float* y, const torch::Tensor& gain, float* x, int64_t R) const {
    if (!gain.defined()) {
      for (int64_t i = 0; i < R * D; ++i) x[i] += y[i];
      return;
    }
    const float* g = gain.data_ptr<float>();
    each_row(R, [&](int64_t r) {
      const float* yr = y + r * D;
      const float inv = 1.0f / std::sqrt(dot_product(yr, yr, D) / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) x[r * D + i] += yr[i] * inv * g[i];
    });
  }

  // QK-norm of one token's q and k heads (row: (H + KvH) x Hd, q heads first) with layer l's gains g:
  // v <- v * rsqrt(sum(v^2) / n + eps) * g over each head (n = Hd), or over all q heads and all k heads at once.
  void qk_norm(float* row, int64_t l) const {
    const float* g = specs[l].qk_gain.data_ptr<float>();
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

  // v (Hd) <- v * cos + rot(v) * sin at one position, over its first P dims (the tables' width; the rest pass):
  // each pair (a, b) of the style in place, a' = a cos - b sin, b' = b cos + a sin.
  void rope(float* v, const float* c, const float* s) const {
    const int64_t P = cos.size(1), half = P / 2;
    for (int64_t j = 0; j < half; ++j) {
      const int64_t i = half_style ? j : 2 * j, k = half_style ? j + half : 2 * j + 1;
      const float a = v[i], b = v[k];
      v[i] = a * c[i] + -b * s[i];
      v[k] = b * c[k] + a * s[k];
    }
  }

  template <typename KV>
  void attend(const float* q, const KV& kv, int64_t l, float* att, int64_t B, int64_t C, int64_t window) const {
    attend_kv(q, kv, l, att, B, C, window, H, KvH, Hd, attn_softcap);
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
    // this thread's buffers, kept between calls (grown, never shrunk): allocated per call, a prompt's first calls
    // paid ~20% in page faults (glibc maps large blocks afresh until its thresholds adapt)
    thread_local StepBuffers buf;
    auto& x = sized(buf.x, R * D);
    auto& x2 = sized(buf.x2, R * D);
    auto& xn = sized(buf.xn, R * D);
    auto& qkv = sized(buf.qkv, R * QKV);
    auto& q = sized(buf.q, R * H * Hd);
    auto& att = sized(buf.att, R * H * Hd);
    auto& scratch = buf.scratch;
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(tp[r] >= 0 && tp[r] < V, "token id ", tp[r], " out of range");
      TORCH_CHECK(pp[r] >= 0 && pp[r] < cos.size(0), "position ", pp[r], " beyond the RoPE table");
      embed_row(tp[r], &x[r * D]);
      if (embed_scale != 1.0f)
        for (int64_t i = 0; i < D; ++i) x[r * D + i] *= embed_scale;
    }
    int64_t longest = 0;  // longrope: one choice of tables per call, over every row (as the torch step)
    for (int64_t r = 0; r < R; ++r) longest = std::max(longest, pp[r] + 1);
    const bool use_long = long_after >= 0 && longest > long_after;
    const int64_t P = cos.size(1);
    for (int64_t l = 0; l < L; ++l) {
      const auto& lay = layers[l];
      const LayerSpec& sp = specs[l];
      const torch::Tensor& ct = sp.rope == ROPE_LOCAL ? cos_local : (use_long ? cos_long : cos);
      const torch::Tensor& st = sp.rope == ROPE_LOCAL ? sin_local : (use_long ? sin_long : sin);
      // the last layer when only each row's last token reaches the head: every token's K / V go to the cache, the
      // rest of the layer (attention, output projection, FFN) runs on the B last tokens alone (llama.cpp skips the
      // same rows). Those rows' values differ only by fp32 summation order (B < 9 rows take the GEMV, not the GEMM)
      const bool last_only = l == L - 1 && C > 1 && !all_logits;
      if (sp.pre_norm) rms(x.data(), xn.data(), R, D);
      lay[0].apply(sp.pre_norm ? xn.data() : x.data(), qkv.data(), R, nullptr, scratch);
      each_row_chunk(R, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / C, c = r % C;
          const bool keep_q = !last_only || c == C - 1;
          const float* cs = ct.data_ptr<float>() + pp[r] * P;
          const float* sn = st.data_ptr<float>() + pp[r] * P;
          float* row = &qkv[r * QKV];
          if (sp.qk_gain.defined()) qk_norm(row, l);
          if (sp.rope != ROPE_NONE)
            for (int64_t h = keep_q ? 0 : H; h < H + KvH; ++h) rope(row + h * Hd, cs, sn);
          for (int64_t h = 0; h < KvH; ++h) {
            const int64_t slot = kv.offset(l, b, h, kv.start(b) + c);
            std::memcpy(kv.k + slot, row + (H + h) * Hd, Hd * sizeof(float));
            std::memcpy(kv.v + slot, row + (H + KvH + h) * Hd, Hd * sizeof(float));
          }
          if (keep_q) std::memcpy(&q[(last_only ? b : r) * H * Hd], row, H * Hd * sizeof(float));  // rotated q heads
        }
      });
      int64_t rows = R;  // the rows that go on through the layer
      if (last_only) {
        for (int64_t b = 0; b < B; ++b) std::memcpy(&x[b * D], &x[(b * C + C - 1) * D], D * sizeof(float));
        attend(q.data(), kv.shifted(C - 1, B, buf.starts), l, att.data(), B, 1, sp.window);
        rows = B;
      } else {
        attend(q.data(), kv, l, att.data(), B, C, sp.window);
      }
      residual(lay[1], att.data(), sp.attn_out_gain, x, x2, rows, scratch);
      if (sp.pre_norm) rms(x.data(), xn.data(), rows, D);
      if (moe_of[l] >= 0) {  // the experts' weighted sum into x2, then the residual
        moe[moe_of[l]].apply(sp.pre_norm ? xn.data() : x.data(), x2.data(), rows, scratch);
        add_output(x2.data(), sp.ffn_out_gain, x.data(), rows);
        continue;
      }
      const int64_t F2 = lay[2].N, F = F2 / 2;
      auto& gu = sized(buf.gu, rows * F2);
      auto& f = sized(buf.f, rows * F);
      lay[2].apply(sp.pre_norm ? xn.data() : x.data(), gu.data(), rows, nullptr, scratch);
      each_row(rows, [&](int64_t r) { gate_row(&gu[r * F2], &gu[r * F2 + F], &f[r * F], F, act); });
      residual(lay[3], f.data(), sp.ffn_out_gain, x, x2, rows, scratch);
    }
    const int64_t out_rows = all_logits ? R : B;  // the last layer left each row's last token at row b (C > 1)
    rms(x.data(), xn.data(), out_rows, D);
    auto logits = torch::empty({out_rows, head.N}, cos.options());
    head.apply(xn.data(), logits.data_ptr<float>(), out_rows, nullptr, scratch);
    if (logits_scaling != 1.0f) logits.div_(logits_scaling);
    if (final_softcap > 0) logits.div_(final_softcap).tanh_().mul_(final_softcap);
    return logits;
  }
};

}  // namespace scratchlm
