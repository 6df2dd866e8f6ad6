// `Linear`: one weight matrix in a matrix_ref.h Format plus the vectors around it, owning its tensors:
//   y = ((x * in_scale) W^T) * out_scale + bias          (each factor optional)
// exactly as the Python PackedLinear it mirrors. The A8 formats take the ggml blocks (Q8_0 / Q4_1) and
// repack them once here into gemv_a8.h's 16-row-interleaved layout.

#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

#include "matrix_ref.h"

namespace scratchlm {

inline const float* opt_ptr(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

struct Linear {
  torch::Tensor w, scales, in_scale, out_scale, bias;  // kept alive here; undefined when absent
  MatrixRef ref;

  Linear(int format, torch::Tensor w_, int64_t N, int64_t K, std::optional<torch::Tensor> in,
         std::optional<torch::Tensor> out, std::optional<torch::Tensor> b)
      : w(w_.contiguous()), in_scale(vec(in, K)), out_scale(vec(out, N)), bias(vec(b, N)) {
    TORCH_CHECK(format >= F32 && format <= Q4_1_A8, "unknown weight format code ", format);
    TORCH_CHECK(w.device().is_cpu(), "the decode kernels run on CPU tensors");
    TORCH_CHECK(K % (format == F32 || format == BF16 ? 16 : QK) == 0, "K = ", K, " is not a multiple of the format's block");
    const int stored = format == Q8_0_A8 ? Q8_0 : (format == Q4_1_A8 ? Q4_1 : format);  // what w holds
    const MatrixRef given{stored, w.data_ptr(), N, K, nullptr, nullptr};
    TORCH_CHECK(w.numel() * w.element_size() == N * given.row_bytes(), "weight bytes do not match (", N, ", ", K, ")");
    if (is_a8(format)) {
      const bool q4 = format == Q4_1_A8;
      TORCH_CHECK(w.scalar_type() == torch::kUInt8, "ggml blocks must be uint8 bytes, got ", w.scalar_type());
      auto packed = torch::empty({a8_weight_bytes(q4, N, K)}, w.options());
      scales = torch::empty({a8_scale_count(q4, N, K)}, w.options().dtype(torch::kInt16));
      pack_a8(q4, w.data_ptr<uint8_t>(), N, K, packed.data_ptr<uint8_t>(),
              reinterpret_cast<uint16_t*>(scales.data_ptr<int16_t>()));
      w = packed;
    }
    ref = MatrixRef{format, w.data_ptr(), N, K, opt_ptr(out_scale), opt_ptr(bias),
                    scales.defined() ? reinterpret_cast<const uint16_t*>(scales.data_ptr<int16_t>()) : nullptr};
  }

  static torch::Tensor vec(const std::optional<torch::Tensor>& t, int64_t n) {
    if (!t.has_value()) return torch::Tensor();
    TORCH_CHECK(t->numel() == n, "expected a vector of ", n, " values, got ", t->numel());
    return t->to(torch::kFloat32).contiguous();
  }

  // y (B, N) = this(x (B, K)) (+ residual (B, N), which must not alias y); scratch holds x * in_scale.
  void apply(const float* x, float* y, int64_t B, const float* residual, std::vector<float>& scratch) const {
    if (in_scale.defined()) {
      const float* g = in_scale.data_ptr<float>();
      scratch.resize(B * ref.K);
      for (int64_t i = 0; i < B * ref.K; ++i) scratch[i] = x[i] * g[i % ref.K];
      x = scratch.data();
    }
    ref.matvec(x, y, B, residual);
  }

  // x (B, K) fp32 CPU -> y (B, N) fp32: this linear on its own (PackedLinear's kernel call, tests).
  torch::Tensor forward(const torch::Tensor& x) const {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.size(1) == ref.K,
                "x must be an fp32 CPU tensor (B, ", ref.K, "), got ", x.scalar_type(), " ", x.sizes());
    auto xc = x.contiguous();
    auto y = torch::empty({x.size(0), ref.N}, x.options());
    std::vector<float> scratch;
    apply(xc.data_ptr<float>(), y.data_ptr<float>(), x.size(0), nullptr, scratch);
    return y;
  }
};

}  // namespace scratchlm
