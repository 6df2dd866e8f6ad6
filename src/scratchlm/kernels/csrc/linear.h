// `Linear`: one weight matrix plus the vectors around it, owning its tensors:
//   y = ((x * in_scale) W^T) * out_scale + bias          (each factor optional)
// exactly as the Python PackedLinear it mirrors. W is one or more parts stacked by rows, each in its own
// matrix_ref.h Format (a GGUF's q, k, v may be Q4_K, Q4_K, Q6_K: rows are independent, so each part runs
// its own kernel into its rows of y). The A8 formats take the ggml blocks (Q8_0 / Q4_1) and repack them
// once here into gemv_a8.h's 16-row-interleaved layout (one part only); the A8 row formats (any block type,
// gemv_a8_blocks.h) read the blocks in place, x rounded once per apply for all parts.

#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "matrix_ref.h"

namespace scratchlm {

inline const float* opt_ptr(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// One matrix part's rows [0, N) on its input x (B rows, prepared in px) into y (+ residual), both at the part's
// first row: an item of run_parts.
struct PartJob {
  const MatrixRef* part;
  const float* x;
  float* y;
  const float* residual;
  const PreparedX* px;
};

// Every job's rows in one parallel region, in chunks counted from each part's first row (as the part's own matvec
// splits it: the prompt GEMM pairs 12-row groups from there, strassen_gemm.h), sized by the work per row of all
// the jobs together. The parts of one matrix (Linear::apply), or of several (moe_layer.h's chosen experts).
inline void run_parts(const std::vector<PartJob>& jobs, int64_t B) {
  int64_t rows = 0, bytes = 0;
  for (const auto& j : jobs) rows += j.part->N, bytes += j.part->N * j.part->row_bytes();
  const int64_t chunk = row_chunk(rows, bytes / std::max<int64_t>(rows, 1) * B);
  std::vector<int64_t> first(jobs.size() + 1, 0);  // job i's chunks: [first[i], first[i + 1])
  for (size_t i = 0; i < jobs.size(); ++i) first[i + 1] = first[i] + (jobs[i].part->N + chunk - 1) / chunk;
  parallel_chunks(first.back(), chunk >= rows ? first.back() : 1, [&](int64_t c0, int64_t c1) {  // no split: one thread
    for (int64_t c = c0; c < c1; ++c) {
      const size_t i = std::upper_bound(first.begin(), first.end(), c) - first.begin() - 1;
      const PartJob& j = jobs[i];
      const int64_t lo = (c - first[i]) * chunk, hi = std::min(j.part->N, lo + chunk);
      j.part->range(j.x, j.y, B, j.residual, lo, hi, *j.px);
    }
  });
}

struct Linear {
  std::vector<torch::Tensor> ws, scales;               // each part's weights (and A8 scales), kept alive here
  std::vector<torch::Tensor> repacked;                 // the parts' repacked copies (gemv_r16.h)
  torch::Tensor in_scale, out_scale, bias;             // undefined when absent
  std::vector<MatrixRef> parts;                        // rows [start_i, start_i + N_i) of W
  std::vector<int64_t> starts;
  int64_t N = 0, K = 0;

  // formats[i], ws[i] (N_i rows): the parts top to bottom; K the common row length. r16[i], where given and
  // defined: part i's Q4_K / Q4_0 / Q2_K / Q3_K blocks repacked by repack_r16 (read instead of them; shared).
  Linear(std::vector<int> formats, std::vector<torch::Tensor> ws_, std::vector<int64_t> rows, int64_t K_,
         std::optional<torch::Tensor> in, std::optional<torch::Tensor> out, std::optional<torch::Tensor> b,
         std::vector<std::optional<torch::Tensor>> r16 = {})
      : K(K_) {
    TORCH_CHECK(!formats.empty() && formats.size() == ws_.size() && formats.size() == rows.size(),
                "one format, weight tensor and row count per part");
    TORCH_CHECK(r16.empty() || r16.size() == formats.size(), "one repacked copy (or None) per part");
    for (int64_t n : rows) N += n;
    in_scale = vec(in, K), out_scale = vec(out, N), bias = vec(b, N);
    int64_t start = 0;
    for (size_t i = 0; i < formats.size(); ++i) {
      TORCH_CHECK(!is_a8(formats[i]) || formats.size() == 1, "an A8 format is a whole matrix, not a part");
      add_part(formats[i], ws_[i].contiguous(), rows[i], start);
      if (!r16.empty() && r16[i].has_value() && r16[i]->defined()) add_r16(*r16[i]);
      start += rows[i];
    }
  }

  // The last part's repacked copy (gemv_r16.h), checked against the part's shape, kept alive here.
  void add_r16(const torch::Tensor& t) {
    MatrixRef& p = parts.back();
    TORCH_CHECK(can_repack(p.format, p.N, K), "a repacked copy is for a Q4_K / Q4_0 / Q2_K / Q3_K part of whole 16-row groups, K a "
                "multiple of 256, in a build with gemv_fixed24.h (format ", p.format, ", ", p.N, " x ", K, ")");
    const int64_t bytes = r16_copy_bytes(p.format, p.N, K);
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kUInt8 && t.is_contiguous() && t.numel() == bytes,
                "the repacked copy must be ", bytes, " contiguous uint8 bytes");
    p.r16 = t.data_ptr<uint8_t>();
    repacked.push_back(t);
  }

  void add_part(int format, torch::Tensor w, int64_t rows, int64_t start) {
    TORCH_CHECK((format >= F32 && format < FORMAT_END) || is_a8_row(format), "unknown weight format code ", format);
    TORCH_CHECK(w.device().is_cpu(), "the decode kernels run on CPU tensors");
    int64_t qk, bytes;
    block_shape(format, qk, bytes);
    TORCH_CHECK(K % qk == 0, "K = ", K, " is not a multiple of the format's block (", qk, " values)");
    const int stored = format == Q8_0_A8 ? Q8_0 : (format == Q4_1_A8 ? Q4_1 : format);  // what w holds
    const MatrixRef given{stored, w.data_ptr(), rows, K, nullptr, nullptr};
    TORCH_CHECK(w.numel() * w.element_size() == rows * given.row_bytes(), "weight bytes do not match (", rows,
                ", ", K, ")");
    torch::Tensor s;
    if (is_a8(format)) {
      const bool q4 = format == Q4_1_A8;
      TORCH_CHECK(w.scalar_type() == torch::kUInt8, "ggml blocks must be uint8 bytes, got ", w.scalar_type());
      auto packed = torch::empty({a8_weight_bytes(q4, rows, K)}, w.options());
      s = torch::empty({a8_scale_count(q4, rows, K)}, w.options().dtype(torch::kInt16));
      pack_a8(q4, w.data_ptr<uint8_t>(), rows, K, packed.data_ptr<uint8_t>(),
              reinterpret_cast<uint16_t*>(s.data_ptr<int16_t>()));
      w = packed;
    }
    const float* os = opt_ptr(out_scale);
    const float* bs = opt_ptr(bias);
    parts.push_back(MatrixRef{format, w.data_ptr(), rows, K, os ? os + start : nullptr, bs ? bs + start : nullptr,
                              s.defined() ? reinterpret_cast<const uint16_t*>(s.data_ptr<int16_t>()) : nullptr, N});
    starts.push_back(start);
    ws.push_back(w), scales.push_back(s);
  }

  static torch::Tensor vec(const std::optional<torch::Tensor>& t, int64_t n) {
    if (!t.has_value()) return torch::Tensor();
    TORCH_CHECK(t->numel() == n, "expected a vector of ", n, " values, got ", t->numel());
    return t->to(torch::kFloat32).contiguous();
  }

  // Bytes of W (all parts): the grain of the row split.
  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& p : parts) total += p.N * p.row_bytes();
    return total;
  }

  // y (B, N) = this(x (B, K)) (+ residual (B, N), which must not alias y); scratch holds x * in_scale.
  void apply(const float* x, float* y, int64_t B, const float* residual, std::vector<float>& scratch) const {
    if (in_scale.defined()) {
      const float* g = in_scale.data_ptr<float>();
      scratch.resize(B * K);
      for (int64_t b = 0; b < B; ++b)  // row by row: no division per value
        for (int64_t k = 0; k < K; ++k) scratch[b * K + k] = x[b * K + k] * g[k];
      x = scratch.data();
    }
    if (parts.size() == 1) return parts[0].matvec(x, y, B, residual);
    PreparedX& px = prepared_x();  // x's other forms, each prepared once for all parts
    px.reset();
    std::vector<PartJob> jobs;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i].prepare(x, B, px);
      jobs.push_back({&parts[i], x, y + starts[i], residual ? residual + starts[i] : nullptr, &px});
    }
    run_parts(jobs, B);
  }

  // x (B, K) fp32 CPU -> y (B, N) fp32: this linear on its own (PackedLinear's kernel call, tests).
  torch::Tensor forward(const torch::Tensor& x) const {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.size(1) == K,
                "x must be an fp32 CPU tensor (B, ", K, "), got ", x.scalar_type(), " ", x.sizes());
    auto xc = x.contiguous();
    auto y = torch::empty({x.size(0), N}, x.options());
    std::vector<float> scratch;
    apply(xc.data_ptr<float>(), y.data_ptr<float>(), x.size(0), nullptr, scratch);
    return y;
  }
};

}  // namespace scratchlm
