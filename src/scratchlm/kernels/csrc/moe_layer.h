// A mixture-of-experts FFN inside the C++ step (llama_step.h): nn/moe.py's function on each row, the experts'
// matrices in any matrix_ref.h format (a GGUF's stacked expert tensors: each expert's rows are one slice).
//   logits = Wr x_hat                                     (E,)   (the router reads the normed x, gain folded in)
//   "softmax_topk": p = softmax(logits); (w, idx) = top_k(p); w <- w / sum(w) when norm_topk   (Qwen-MoE)
//   "topk_softmax": (l, idx) = top_k(logits); w = softmax(l)                                    (Mixtral)
//   y = sum_j w_j down_e(act(gate_e x) * up_e x),  e = idx_j,  x = x_hat * g   (g: the pre-FFN norm's gain)
//   [shared expert] y <- y + sigmoid(w_s . x) down_s(act(gate_s x) * up_s x)                   (Qwen2-MoE)
// top_k orders by value, the lower expert first among equal values. Rows are grouped by expert: each chosen expert
// runs once on all its rows (its gate|up and down Linears), and y sums the experts' weighted outputs in ascending
// expert order, as nn/moe.py's grouped path does with index_add (each term w * out rounded, then added). One row
// (a decode step) runs the k experts' gate|up matrices in one parallel region and their down matrices in a second
// (linear.h's run_parts, as Linear::apply runs its parts), instead of two regions per expert.
// Shapes: x_hat, y (R, D); gate|up (2F, D) per expert, gate rows first; down (D, F).

#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "aligned_buffer.h"
#include "gate_activation.h"
#include "linear.h"

namespace scratchlm {

constexpr int64_t ROUTER_SOFTMAX_TOPK = 0, ROUTER_TOPK_SOFTMAX = 1;

// MoELayer::apply's work buffers (kept per thread between calls, grown only)
struct MoEBuffers {
  FloatBuf logits, xin, xs, gu, f, out;
  std::vector<float> w, p;
  std::vector<int64_t> idx, order;
  std::vector<std::unique_ptr<PreparedX>> px;  // one row: each chosen expert's down input, prepared (px[0]: x for
                                               // all gate|ups)
};

// y (n) += w * v (n), each product rounded, then added: nn/moe.py's index_add of w * out
inline void add_scaled(float* y, const float* v, float w, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const float term = v[c] * w;
    y[c] += term;
  }
}

struct MoELayer {
  Linear router;                      // (E, D)
  std::vector<Linear> gate_up, down;  // per expert: (2F, D) gate | up, (D, F)
  std::vector<Linear> shared;         // none, or the shared expert's (2Fs, D) gate | up, (D, Fs) down, (1, D) gate
  torch::Tensor gain;                 // (D,) fp32, or undefined: x = x_hat
  int64_t top_k, router_kind, act;
  bool norm_topk;

  MoELayer(Linear router_, std::vector<Linear> gate_up_, std::vector<Linear> down_, torch::Tensor gain_,
           int64_t top_k_, int64_t router_kind_, bool norm_topk_, int64_t act_, std::vector<Linear> shared_ = {})
      : router(std::move(router_)), gate_up(std::move(gate_up_)), down(std::move(down_)), shared(std::move(shared_)),
        gain(gain_.numel() ? gain_.to(torch::kFloat32).contiguous() : torch::Tensor()), top_k(top_k_),
        router_kind(router_kind_), act(act_), norm_topk(norm_topk_) {
    const int64_t E = router.N, D = router.K;
    TORCH_CHECK(E > 0 && static_cast<int64_t>(gate_up.size()) == E && static_cast<int64_t>(down.size()) == E,
                "one gate|up and one down Linear per expert (", E, " router rows)");
    TORCH_CHECK(top_k >= 1 && top_k <= E, "top_k must be in [1, ", E, "], got ", top_k);
    TORCH_CHECK(router_kind == ROUTER_SOFTMAX_TOPK || router_kind == ROUTER_TOPK_SOFTMAX, "unknown router ",
                router_kind);
    TORCH_CHECK(act == ACT_SILU || act == ACT_GELU || act == ACT_GELU_TANH, "unknown activation code ", act);
    TORCH_CHECK(!gain.defined() || (gain.dim() == 1 && gain.size(0) == D), "the expert input gain must be (D,)");
    for (int64_t e = 0; e < E; ++e) {
      TORCH_CHECK(gate_up[e].K == D && gate_up[e].N % 2 == 0 && down[e].N == D && down[e].K == gate_up[e].N / 2,
                  "expert ", e, ": gate|up must be (2F, ", D, ") and down (", D, ", F)");
      for (const Linear* lin : {&gate_up[e], &down[e]})
        TORCH_CHECK(!lin->in_scale.defined() && !lin->out_scale.defined() && !lin->bias.defined(),
                    "expert ", e, ": its matrices take no scales or bias");
    }
    TORCH_CHECK(shared.empty() || (shared.size() == 3 && shared[0].K == D && shared[0].N % 2 == 0 &&
                                   shared[1].N == D && shared[1].K == shared[0].N / 2 && shared[2].N == 1 &&
                                   shared[2].K == D),
                "a shared expert is (gate|up (2Fs, ", D, "), down (", D, ", Fs), gate (1, ", D, "))");
  }

  int64_t experts() const { return router.N; }

  // One row's routing: logits (E) -> w, idx (top_k), see the header.
  void route(const float* logits, float* w, int64_t* idx, std::vector<float>& p, std::vector<int64_t>& order) const {
    const int64_t E = experts();
    p.assign(logits, logits + E);
    if (router_kind == ROUTER_SOFTMAX_TOPK) softmax(p.data(), E);
    order.resize(E);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < top_k; ++j) idx[j] = order[j], w[j] = p[order[j]];
    if (router_kind == ROUTER_TOPK_SOFTMAX) {
      softmax(w, top_k);
    } else if (norm_topk) {
      float s = 0.0f;
      for (int64_t j = 0; j < top_k; ++j) s += w[j];
      for (int64_t j = 0; j < top_k; ++j) w[j] = w[j] / s;
    }
  }

  // v (n) <- softmax(v) = exp(v - max) / sum exp(v - max)
  static void softmax(float* v, int64_t n) {
    const float mx = *std::max_element(v, v + n);
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += (v[i] = std::exp(v[i] - mx));
    for (int64_t i = 0; i < n; ++i) v[i] = v[i] / s;
  }

  // y (R, D) = MoE(x_hat (R, D)); scratch as Linear::apply's.
  void apply(const float* xh, float* y, int64_t R, std::vector<float>& scratch) const {
    thread_local MoEBuffers buf;
    const int64_t E = experts(), D = router.K, k = top_k;
    auto& logits = sized(buf.logits, R * E);
    router.apply(xh, logits.data(), R, nullptr, scratch);
    buf.w.resize(R * k), buf.idx.resize(R * k);
    for (int64_t r = 0; r < R; ++r) route(&logits[r * E], &buf.w[r * k], &buf.idx[r * k], buf.p, buf.order);
    const float* x = xh;
    if (gain.defined()) {
      auto& xin = sized(buf.xin, R * D);
      const float* g = gain.data_ptr<float>();
      for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < D; ++i) xin[r * D + i] = xh[r * D + i] * g[i];
      x = xin.data();
    }
    std::fill(y, y + R * D, 0.0f);
    if (R == 1) {
      one_row(x, y, buf);
      if (!shared.empty()) add_shared(x, y, R, buf, scratch);
      return;
    }
    // the (row, slot) pairs by expert, rows ascending within each expert
    std::vector<int64_t> pairs(R * k);
    std::iota(pairs.begin(), pairs.end(), 0);
    std::stable_sort(pairs.begin(), pairs.end(), [&](int64_t a, int64_t b) { return buf.idx[a] < buf.idx[b]; });
    for (int64_t i0 = 0; i0 < R * k;) {
      const int64_t e = buf.idx[pairs[i0]];
      int64_t i1 = i0;
      while (i1 < R * k && buf.idx[pairs[i1]] == e) ++i1;
      const int64_t n = i1 - i0, F2 = gate_up[e].N, F = F2 / 2;
      auto& xs = sized(buf.xs, n * D);
      for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[i * D], x + (pairs[i0 + i] / k) * D, D * sizeof(float));
      auto& gu = sized(buf.gu, n * F2);
      auto& f = sized(buf.f, n * F);
      auto& out = sized(buf.out, n * D);
      gate_up[e].apply(xs.data(), gu.data(), n, nullptr, scratch);
      for (int64_t i = 0; i < n; ++i) gate_row(&gu[i * F2], &gu[i * F2 + F], &f[i * F], F, act);
      down[e].apply(f.data(), out.data(), n, nullptr, scratch);
      for (int64_t i = 0; i < n; ++i) add_scaled(y + pairs[i0 + i] / k * D, &out[i * D], buf.w[pairs[i0 + i]], D);
      i0 = i1;
    }
    if (!shared.empty()) add_shared(x, y, R, buf, scratch);
  }

  // y (R, D) += sigmoid(w_s . x) * SharedFFN(x), each term rounded, then added (nn/moe.py's order)
  void add_shared(const float* x, float* y, int64_t R, MoEBuffers& buf, std::vector<float>& scratch) const {
    const int64_t D = router.K, F2 = shared[0].N, F = F2 / 2;
    auto& gu = sized(buf.gu, R * F2);
    auto& f = sized(buf.f, R * F);
    auto& out = sized(buf.out, R * D);
    auto& gate = sized(buf.logits, R);
    shared[0].apply(x, gu.data(), R, nullptr, scratch);
    for (int64_t r = 0; r < R; ++r) gate_row(&gu[r * F2], &gu[r * F2 + F], &f[r * F], F, act);
    shared[1].apply(f.data(), out.data(), R, nullptr, scratch);
    shared[2].apply(x, gate.data(), R, nullptr, scratch);
    for (int64_t r = 0; r < R; ++r) add_scaled(y + r * D, &out[r * D], 1.0f / (1.0f + std::exp(-gate[r])), D);
  }

  // R = 1: y (D) = sum over the k chosen experts, ascending, of w_j down_e(act(gate_e x) * up_e x); two parallel
  // regions (all gate|up parts on x, then each down part on its own f), the products as Linear::apply's.
  void one_row(const float* x, float* y, MoEBuffers& buf) const {
    const int64_t k = top_k, D = router.K;
    std::vector<int64_t> slot(k);  // slots by ascending expert
    std::iota(slot.begin(), slot.end(), 0);
    std::sort(slot.begin(), slot.end(), [&](int64_t a, int64_t b) { return buf.idx[a] < buf.idx[b]; });
    while (static_cast<int64_t>(buf.px.size()) < k) buf.px.push_back(std::make_unique<PreparedX>());
    int64_t F2max = 0;
    for (int64_t j = 0; j < k; ++j) F2max = std::max(F2max, gate_up[buf.idx[j]].N);
    auto& gu = sized(buf.gu, k * F2max);
    auto& f = sized(buf.f, k * F2max / 2);
    auto& out = sized(buf.out, k * D);
    std::vector<PartJob> jobs;
    PreparedX& px = *buf.px[0];
    px.reset();
    for (int64_t j = 0; j < k; ++j) {
      const Linear& lin = gate_up[buf.idx[slot[j]]];
      for (size_t i = 0; i < lin.parts.size(); ++i) {
        lin.parts[i].prepare(x, 1, px);
        jobs.push_back({&lin.parts[i], x, &gu[j * F2max + lin.starts[i]], nullptr, &px});
      }
    }
    run_parts(jobs, 1);
    jobs.clear();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = buf.idx[slot[j]], F = gate_up[e].N / 2;
      gate_row(&gu[j * F2max], &gu[j * F2max + F], &f[j * F2max / 2], F, act);
      const Linear& lin = down[e];
      PreparedX& pj = *buf.px[j];
      pj.reset();
      for (size_t i = 0; i < lin.parts.size(); ++i) {
        lin.parts[i].prepare(&f[j * F2max / 2], 1, pj);
        jobs.push_back({&lin.parts[i], &f[j * F2max / 2], &out[j * D + lin.starts[i]], nullptr, &pj});
      }
    }
    run_parts(jobs, 1);
    for (int64_t j = 0; j < k; ++j) add_scaled(y, &out[j * D], buf.w[slot[j]], D);
  }
};

}  // namespace scratchlm
