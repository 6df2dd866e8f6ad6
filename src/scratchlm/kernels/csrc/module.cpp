// Python bindings of scratchlm's decode kernels (gemv.h / gemv_a8.h: the matrix-vector kernels, matrix_ref.h:
// one matrix in a format, linear.h: with its scales and bias; llama_step.h: a whole Llama decode step) and of the
// training attention's causal softmax (causal_softmax.h, attention_scores.h), the LM head's cross entropy rows
// (cross_entropy_rows.h), the training RMSNorm (rms_norm_rows.h), SwiGLU gate (silu_gate.h) and RoPE
// (rope_rows.h). Built by kernels/build.py with
// torch.utils.cpp_extension.

#include <torch/extension.h>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#endif

#include "attention_scores.h"
#include "causal_softmax.h"
#include "cross_entropy_rows.h"
#include "llama_step.h"
#include "rms_norm_rows.h"
#include "rope_rows.h"
#include "silu_gate.h"

namespace {

using scratchlm::MatrixRef;

// exp(x - mx) of a row (softmax_exp.h) and its sum, for the tests
std::tuple<torch::Tensor, double> exp_sum(torch::Tensor x, double mx) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 1, "x must be a 1-D fp32 tensor");
  auto out = x.contiguous().clone();
  const float sum = scratchlm::exp_sum(out.data_ptr<float>(), out.numel(), static_cast<float>(mx));
  return {out, sum};
}

void check_x(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous fp32 CPU tensor (B, K), got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(x.size(1) == K, "x has ", x.size(1), " columns, the matrix has K = ", K);
}

torch::Tensor apply(const MatrixRef& w, const torch::Tensor& x) {
  check_x(x, w.K);
  auto y = torch::empty({x.size(0), w.N}, x.options());
  w.matvec(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), nullptr);
  return y;
}

// w: the matrix's bytes in `format` (ggml blocks as uint8, or a dense tensor), N rows of K values.
MatrixRef matrix(const torch::Tensor& w, int64_t N, int64_t K, int format) {
  TORCH_CHECK((format >= 0 && format < scratchlm::FORMAT_END && !scratchlm::is_a8(format)) || scratchlm::is_a8_row(format),
              "not a plain weight format: ", format);
  int64_t qk, bytes;
  scratchlm::block_shape(format, qk, bytes);
  TORCH_CHECK(K % qk == 0, "K = ", K, " is not a multiple of the format's block (", qk, " values)");
  MatrixRef m{format, w.data_ptr(), N, K, nullptr, nullptr};
  TORCH_CHECK(w.device().is_cpu() && w.is_contiguous() && w.numel() * w.element_size() == N * m.row_bytes(),
              "weights must be contiguous CPU bytes, ", N * m.row_bytes(), " of them, got ", w.numel() * w.element_size());
  return m;
}

// m reading its repacked copy r16 (repack_r16's of this matrix) instead of its blocks, where one is given.
MatrixRef with_r16(MatrixRef m, const std::optional<torch::Tensor>& r16) {
  if (!r16.has_value() || !r16->defined()) return m;
  TORCH_CHECK(r16->scalar_type() == torch::kUInt8 && r16->is_contiguous() && r16->device().is_cpu() &&
                  r16->numel() > 0 && r16->numel() == scratchlm::r16_copy_bytes(m.format, m.N, m.K),
              "r16 must be repack_r16's copy of this matrix (", scratchlm::r16_copy_bytes(m.format, m.N, m.K),
              " bytes), got ", r16->numel());
  m.r16 = r16->data_ptr<uint8_t>();
  return m;
}

// r16: the matrix's repacked copy (gemv_r16.h), read instead of w where given.
torch::Tensor linear_blocks(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K, int64_t format,
                            std::optional<torch::Tensor> r16) {
  return apply(with_r16(matrix(w, N, K, static_cast<int>(format)), r16), x);
}

// The block matrix's fp32 values through the kernels' own widening: what every GEMV multiplies by.
// out: an fp32 (N, K) contiguous tensor to write into (a reused buffer: a fresh one of tens of MB costs more in
// page faults than the widening itself), else a new one.
// r16: the matrix's repacked copy (gemv_r16.h), read instead of w where given.
torch::Tensor dequantize(const torch::Tensor& w, int64_t N, int64_t K, int64_t format, std::optional<torch::Tensor> out,
                         std::optional<torch::Tensor> r16) {
  TORCH_CHECK(!scratchlm::is_dense(static_cast<int>(format)), "dequantize reads block formats");
  const MatrixRef m = with_r16(matrix(w, N, K, static_cast<int>(format)), r16);
  torch::Tensor y = out.has_value() ? *out : torch::empty({N, K}, torch::kFloat32);
  TORCH_CHECK(y.scalar_type() == torch::kFloat32 && y.is_contiguous() && y.numel() == N * K && y.device().is_cpu(),
              "dequantize: out must be a contiguous fp32 CPU tensor of N * K values");
  m.dequantize(y.data_ptr<float>());
  return y.view({N, K});
}

torch::Tensor linear_dense(const torch::Tensor& x, const torch::Tensor& w, torch::ScalarType dtype, int format) {
  TORCH_CHECK(w.scalar_type() == dtype, "w must be ", dtype, ", got ", w.scalar_type());
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "w must be a contiguous (N, K) matrix");
  TORCH_CHECK(w.size(1) % 16 == 0, "K = ", w.size(1), " is not a multiple of 16");
  return apply(MatrixRef{format, w.data_ptr(), w.size(0), w.size(1), nullptr, nullptr}, x);
}

torch::Tensor linear_f32(const torch::Tensor& x, const torch::Tensor& w) {
  return linear_dense(x, w, torch::kFloat32, scratchlm::F32);
}

torch::Tensor linear_bf16(const torch::Tensor& x, const torch::Tensor& w) {
  return linear_dense(x, w, torch::kBFloat16, scratchlm::BF16);
}

// x (B, K) fp32 -> (q int8 (B, K), d fp32 (B, K / 32)): the activation quantization of the A8 formats.
std::tuple<torch::Tensor, torch::Tensor> quantize_act(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % scratchlm::QK == 0, "x must be (B, K) with K a multiple of 32, got ", x.sizes());
  check_x(x, x.size(1));
  scratchlm::ActQ8 a;
  scratchlm::quantize_rows(x.data_ptr<float>(), x.size(0), x.size(1), a);
  auto q = torch::from_blob(a.q.data(), {x.size(0), x.size(1)}, torch::kInt8).clone();
  auto d = torch::from_blob(a.d.data(), {x.size(0), a.nb}, torch::kFloat32).clone();
  return {q, d};
}

// x (B, K) fp32 -> (q int8 (B, K), d fp32 (B, K / qk)): the A8 row formats' rounding per qk = 32 or 256 values.
std::tuple<torch::Tensor, torch::Tensor> quantize_act_blocks(const torch::Tensor& x, int64_t qk) {
  TORCH_CHECK(qk == 32 || qk == 256, "activation blocks are 32 or 256 values, got ", qk);
  TORCH_CHECK(x.dim() == 2 && x.size(1) % qk == 0, "x must be (B, K) with K a multiple of ", qk, ", got ", x.sizes());
  check_x(x, x.size(1));
  scratchlm::ActRows a;
  scratchlm::quantize_act_rows(x.data_ptr<float>(), x.size(0), x.size(1), qk, a);
  auto q = torch::from_blob(a.q.data(), {x.size(0), x.size(1)}, torch::kInt8).clone();
  auto d = torch::from_blob(a.d.data(), {x.size(0), x.size(1) / qk}, torch::kFloat32).clone();
  return {q, d};
}

bool has_vnni() {
#ifdef SCRATCHLM_VNNI
  return true;
#else
  return false;
#endif
}

bool has_avx512() {
#ifdef SCRATCHLM_AVX512
  return true;
#else
  return false;
#endif
}

std::string simd() {
#if defined(SCRATCHLM_AVX512)
  return "avx512";
#elif defined(SCRATCHLM_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

void check_rows(const torch::Tensor& t, torch::ScalarType dtype, int64_t T, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous() && t.dim() >= 1 &&
              t.size(-1) == T && t.numel() % T == 0,
              name, " must be a contiguous ", dtype, " CPU tensor (..., ", T, "), got ", t.scalar_type(), " ", t.sizes());
}

// scores s (..., T queries, T keys) fp32 -> the causal softmax of scale * s as bf16 (causal_softmax.h)
torch::Tensor causal_softmax_bf16(const torch::Tensor& s, double scale) {
  const int64_t T = s.size(-1);
  check_rows(s, torch::kFloat32, T, "s");
  TORCH_CHECK(s.dim() >= 2 && s.size(-2) % T == 0, "s must be (..., q, T) with whole groups of T queries, got ", s.sizes());
  auto p = torch::empty(s.sizes(), s.options().dtype(torch::kBFloat16));
  scratchlm::causal_softmax_rows(s.data_ptr<float>(), reinterpret_cast<uint16_t*>(p.data_ptr()), s.numel() / T, T,
                                 static_cast<float>(scale));
  return p;
}

// p bf16 and dp fp32 (..., T), d fp32 (...) -> dS = p (dp - d) scale as bf16, 0 above the diagonal
torch::Tensor causal_softmax_grad_bf16(const torch::Tensor& p, const torch::Tensor& dp, const torch::Tensor& d,
                                       double scale) {
  const int64_t T = p.size(-1);
  check_rows(p, torch::kBFloat16, T, "p");
  check_rows(dp, torch::kFloat32, T, "dp");
  TORCH_CHECK(dp.sizes() == p.sizes() && d.is_contiguous() && d.scalar_type() == torch::kFloat32 &&
              d.numel() * T == p.numel(), "dp must match p and d hold one fp32 value per row");
  auto ds = torch::empty(p.sizes(), p.options());
  scratchlm::causal_softmax_grad_rows(reinterpret_cast<const uint16_t*>(p.data_ptr()), dp.data_ptr<float>(),
                                      d.data_ptr<float>(), reinterpret_cast<uint16_t*>(ds.data_ptr()), p.numel() / T, T,
                                      static_cast<float>(scale));
  return ds;
}

void check_heads(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && t.dim() == 3,
              name, " must be a contiguous bf16 CPU tensor (N, rows, Hd), got ", t.scalar_type(), " ", t.sizes());
}

// q (N, M, Hd), k (N, T, Hd) bf16 -> P (N, M, T) bf16: the causal softmax of scale q . k (attention_scores.h)
torch::Tensor causal_probs_bf16(const torch::Tensor& q, const torch::Tensor& k, double scale) {
  TORCH_CHECK(scratchlm::HAS_BF16_DOT, "causal_probs_bf16 needs AVX512-BF16 (has_bf16_dot() is false here)");
  check_heads(q, "q");
  check_heads(k, "k");
  const int64_t N = q.size(0), M = q.size(1), T = k.size(1), Hd = q.size(2);
  TORCH_CHECK(k.size(0) == N && k.size(2) == Hd && Hd % 2 == 0 && M % T == 0,
              "k must be (N, T, Hd) with q (N, G T, Hd), Hd even; got q ", q.sizes(), ", k ", k.sizes());
  auto p = torch::empty({N, M, T}, q.options());
#if defined(__AVX512BF16__) && defined(SCRATCHLM_AVX512)
  scratchlm::causal_probs(reinterpret_cast<const uint16_t*>(q.data_ptr()), reinterpret_cast<const uint16_t*>(k.data_ptr()),
                          reinterpret_cast<uint16_t*>(p.data_ptr()), N, M, T, Hd, static_cast<float>(scale));
#endif
  return p;
}

// p (N, M, T), dout (N, M, Hd), v (N, T, Hd) bf16, d (N, M) fp32 -> dS = scale p (dout . v - d), bf16
torch::Tensor causal_probs_grad_bf16(const torch::Tensor& p, const torch::Tensor& dout, const torch::Tensor& v,
                                     const torch::Tensor& d, double scale) {
  TORCH_CHECK(scratchlm::HAS_BF16_DOT, "causal_probs_grad_bf16 needs AVX512-BF16 (has_bf16_dot() is false here)");
  check_heads(p, "p");
  check_heads(dout, "dout");
  check_heads(v, "v");
  const int64_t N = p.size(0), M = p.size(1), T = p.size(2), Hd = dout.size(2);
  TORCH_CHECK(dout.size(0) == N && dout.size(1) == M && v.size(0) == N && v.size(1) == T && v.size(2) == Hd &&
              Hd % 2 == 0 && M % T == 0 && d.scalar_type() == torch::kFloat32 && d.is_contiguous() &&
              d.numel() == N * M, "p (N, M, T), dout (N, M, Hd), v (N, T, Hd), d (N, M) fp32 disagree");
  auto ds = torch::empty_like(p);
#if defined(__AVX512BF16__) && defined(SCRATCHLM_AVX512)
  scratchlm::causal_probs_grad(reinterpret_cast<const uint16_t*>(p.data_ptr()),
                               reinterpret_cast<const uint16_t*>(dout.data_ptr()),
                               reinterpret_cast<const uint16_t*>(v.data_ptr()), d.data_ptr<float>(),
                               reinterpret_cast<uint16_t*>(ds.data_ptr()), N, M, T, Hd, static_cast<float>(scale));
#endif
  return ds;
}

bool has_bf16_dot() { return scratchlm::HAS_BF16_DOT; }

// logits x (rows, V) fp32 or bf16, targets y (rows,) int64, valid (rows,) bool -> per-row loss (fp32); x <- dL/dx
// when want_grad (cross_entropy_rows.h)
torch::Tensor cross_entropy_rows_(torch::Tensor x, const torch::Tensor& y, const torch::Tensor& valid, double eps,
                                  double z, bool want_grad) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() &&
              (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16),
              "x must be contiguous (rows, V) fp32 or bf16 on CPU, got ", x.scalar_type(), " ", x.sizes());
  const int64_t rows = x.size(0), V = x.size(1);
  TORCH_CHECK(y.scalar_type() == torch::kInt64 && y.is_contiguous() && y.numel() == rows &&
              valid.scalar_type() == torch::kBool && valid.is_contiguous() && valid.numel() == rows,
              "y (int64) and valid (bool) must hold one contiguous value per row");
  TORCH_CHECK(rows == 0 || (y.min().item<int64_t>() >= 0 && y.max().item<int64_t>() < V), "targets must be in [0, V)");
  auto loss = torch::empty({rows}, x.options().dtype(torch::kFloat32));
  const auto* yp = y.data_ptr<int64_t>();
  const auto* vp = valid.data_ptr<bool>();
  if (x.scalar_type() == torch::kFloat32)
    scratchlm::cross_entropy_rows(x.data_ptr<float>(), yp, vp, loss.data_ptr<float>(), rows, V, static_cast<float>(eps),
                                  static_cast<float>(z), want_grad);
  else
    scratchlm::cross_entropy_rows(reinterpret_cast<uint16_t*>(x.data_ptr()), yp, vp, loss.data_ptr<float>(), rows, V,
                                  static_cast<float>(eps), static_cast<float>(z), want_grad);
  return loss;
}

void check_norm_rows(const torch::Tensor& x, const torch::Tensor& g) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous fp32 CPU tensor (rows, D), got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(g.scalar_type() == torch::kFloat32 && g.is_contiguous() && g.numel() == x.size(1),
              "g must be a contiguous fp32 tensor of D = ", x.size(1), " values, got ", g.sizes());
}

// x (rows, D) fp32, g (D,) fp32 -> (y (rows, D) fp32 or bf16 (bf16_out), rstd (rows,) fp32) (rms_norm_rows.h)
std::tuple<torch::Tensor, torch::Tensor> rms_norm_rows(const torch::Tensor& x, const torch::Tensor& g, double eps,
                                                       bool bf16_out) {
  check_norm_rows(x, g);
  const int64_t rows = x.size(0), D = x.size(1);
  auto y = torch::empty({rows, D}, x.options().dtype(bf16_out ? torch::kBFloat16 : torch::kFloat32));
  auto rstd = torch::empty({rows}, x.options());
  if (bf16_out)
    scratchlm::rms_norm_rows(x.data_ptr<float>(), g.data_ptr<float>(), static_cast<float>(eps),
                             reinterpret_cast<uint16_t*>(y.data_ptr()), rstd.data_ptr<float>(), rows, D);
  else
    scratchlm::rms_norm_rows(x.data_ptr<float>(), g.data_ptr<float>(), static_cast<float>(eps), y.data_ptr<float>(),
                             rstd.data_ptr<float>(), rows, D);
  return {y, rstd};
}

// x, g, rstd as the forward saw them, dy (rows, D) fp32 or bf16 -> (dx (rows, D) fp32, dg (D,) fp32)
std::tuple<torch::Tensor, torch::Tensor> rms_norm_rows_grad(const torch::Tensor& x, const torch::Tensor& g,
                                                            const torch::Tensor& rstd, const torch::Tensor& dy) {
  check_norm_rows(x, g);
  const int64_t rows = x.size(0), D = x.size(1);
  TORCH_CHECK(rstd.scalar_type() == torch::kFloat32 && rstd.is_contiguous() && rstd.numel() == rows,
              "rstd must hold one contiguous fp32 value per row");
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.is_contiguous() &&
              (dy.scalar_type() == torch::kFloat32 || dy.scalar_type() == torch::kBFloat16),
              "dy must be contiguous fp32 or bf16 shaped as x ", x.sizes(), ", got ", dy.scalar_type(), " ", dy.sizes());
  auto dx = torch::empty_like(x);
  auto dg = torch::empty_like(g);
  if (dy.scalar_type() == torch::kFloat32)
    scratchlm::rms_norm_rows_grad(x.data_ptr<float>(), g.data_ptr<float>(), rstd.data_ptr<float>(),
                                  dy.data_ptr<float>(), dx.data_ptr<float>(), dg.data_ptr<float>(), rows, D);
  else
    scratchlm::rms_norm_rows_grad(x.data_ptr<float>(), g.data_ptr<float>(), rstd.data_ptr<float>(),
                                  reinterpret_cast<const uint16_t*>(dy.data_ptr()), dx.data_ptr<float>(),
                                  dg.data_ptr<float>(), rows, D);
  return {dx, dg};
}

void check_gate(const std::vector<torch::Tensor>& ts) {
  for (const auto& t : ts)
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.sizes() == ts[0].sizes() &&
                t.scalar_type() == ts[0].scalar_type() &&
                (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16),
                "the gate's tensors must be contiguous CPU tensors of one shape, all fp32 or all bf16; got ",
                t.scalar_type(), " ", t.sizes(), " with ", ts[0].scalar_type(), " ", ts[0].sizes());
}

// gate a, up b -> silu(a) b (silu_gate.h), their dtype
torch::Tensor silu_gate(const torch::Tensor& a, const torch::Tensor& b) {
  check_gate({a, b});
  auto h = torch::empty_like(a);
  if (a.scalar_type() == torch::kFloat32)
    scratchlm::silu_gate(a.data_ptr<float>(), b.data_ptr<float>(), h.data_ptr<float>(), a.numel());
  else
    scratchlm::silu_gate(reinterpret_cast<const uint16_t*>(a.data_ptr()), reinterpret_cast<const uint16_t*>(b.data_ptr()),
                         reinterpret_cast<uint16_t*>(h.data_ptr()), a.numel());
  return h;
}

// a, b, dh -> (da, db) of h = silu(a) b
std::tuple<torch::Tensor, torch::Tensor> silu_gate_grad(const torch::Tensor& a, const torch::Tensor& b,
                                                        const torch::Tensor& dh) {
  check_gate({a, b, dh});
  auto da = torch::empty_like(a), db = torch::empty_like(b);
  if (a.scalar_type() == torch::kFloat32)
    scratchlm::silu_gate_grad(a.data_ptr<float>(), b.data_ptr<float>(), dh.data_ptr<float>(), da.data_ptr<float>(),
                              db.data_ptr<float>(), a.numel());
  else
    scratchlm::silu_gate_grad(reinterpret_cast<const uint16_t*>(a.data_ptr()), reinterpret_cast<const uint16_t*>(b.data_ptr()),
                              reinterpret_cast<const uint16_t*>(dh.data_ptr()), reinterpret_cast<uint16_t*>(da.data_ptr()),
                              reinterpret_cast<uint16_t*>(db.data_ptr()), a.numel());
  return {da, db};
}

// out (B, H, T, Hd) <- x cos + sign rot(x) sin (rope_rows.h); x and out fp32 or bf16 (one dtype), any strides with a
// contiguous last dim; cos, sin (T, Hd) or (B, T, Hd) contiguous fp32
void rope_rows_(const torch::Tensor& x, torch::Tensor out, const torch::Tensor& cos, const torch::Tensor& sin,
                bool half, double sign) {
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu() && x.dim() == 4 && out.sizes() == x.sizes() &&
              x.scalar_type() == out.scalar_type() &&
              (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
              x.stride(3) == 1 && out.stride(3) == 1,
              "x and out must be (B, H, T, Hd) CPU tensors of one dtype (fp32 or bf16) with a contiguous last dim; got ",
              x.scalar_type(), " ", x.sizes(), " and ", out.scalar_type(), " ", out.sizes());
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), Hd = x.size(3);
  TORCH_CHECK(Hd % 2 == 0 && Hd <= scratchlm::ROPE_MAX_HD, "head dim ", Hd, " must be even and at most ",
              scratchlm::ROPE_MAX_HD);
  const bool per_batch = cos.dim() == 3;
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32 && cos.is_contiguous() &&
              sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.size(-1) == Hd && cos.size(-2) == T &&
              (cos.dim() == 2 || (per_batch && cos.size(0) == B)),
              "cos and sin must be contiguous fp32 (T, Hd) or (B, T, Hd) tables; got ", cos.sizes());
  const scratchlm::RowStrides xs{x.stride(0), x.stride(1), x.stride(2)}, os{out.stride(0), out.stride(1), out.stride(2)};
  const int64_t cos_sb = per_batch ? T * Hd : 0;
  if (x.scalar_type() == torch::kFloat32)
    scratchlm::rope_rows(x.data_ptr<float>(), xs, out.data_ptr<float>(), os, cos.data_ptr<float>(), sin.data_ptr<float>(),
                         cos_sb, B, H, T, Hd, half, static_cast<float>(sign));
  else
    scratchlm::rope_rows(reinterpret_cast<const uint16_t*>(x.data_ptr()), xs, reinterpret_cast<uint16_t*>(out.data_ptr()),
                         os, cos.data_ptr<float>(), sin.data_ptr<float>(), cos_sb, B, H, T, Hd, half,
                         static_cast<float>(sign));
}

// Route one batch row of the block types through gemv_centered.h (true, the default) or gemv.h; the old value.
bool set_centered(bool on) { return scratchlm::centered_enabled.exchange(on); }

// Route one batch row of Q2_K / Q3_K / Q4_K / Q5_K / Q6_K through gemv_fixed24.h (true, the default, with
// AVX512-VNNI) and of Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS through gemv_fixed24_b32.h (with VBMI and BITALG too), or the fp32
// kernels; the old value.
bool set_fixed24(bool on) { return scratchlm::fixed24_enabled.exchange(on); }

// Run the prompt GEMM with its Strassen-Winograd level (true, the default) or every product the plain way;
// the old value.
bool set_strassen(bool on) { return scratchlm::strassen_enabled.exchange(on); }

// Q4_K / Q4_0 / Q2_K / Q3_K blocks (N rows of K values, N a multiple of 16, K of 256) -> a copy repacked 16 rows at a time
// (gemv_r16.h).
torch::Tensor repack_r16(const torch::Tensor& w, int64_t N, int64_t K, int64_t format) {
  const int f = static_cast<int>(format);
  TORCH_CHECK(scratchlm::can_repack(f, N, K), "repack_r16: needs gemv_fixed24.h (AVX512-VNNI), a Q4_K / Q4_0 / Q2_K / Q3_K format, "
              "N a multiple of 16 and K of 256, got format ", format, " (", N, ", ", K, ")");
  const MatrixRef m = matrix(w, N, K, f);
  auto out = torch::empty({scratchlm::r16_copy_bytes(f, N, K)}, torch::kUInt8);
  scratchlm::visit_blocks(f, [&](auto blk) {
    if constexpr (scratchlm::has_r16<decltype(blk)>())
      scratchlm::repack_r16<decltype(blk)>(static_cast<const uint8_t*>(m.data), N, K, out.data_ptr<uint8_t>());
  });
  return out;
}

// Drops the resident pages wholly inside t's bytes when they belong to a file's mapping (the GGUF reader's private,
// never-written map: the kernel reads them back from the file if they are touched again); anything else (memory
// of the process's own, where dropping would zero it) is left alone. Returns the bytes dropped (0: none, or not
// Linux). For a matrix whose repacked copy replaced it (kernels/ops.py): the process then holds the copy only.
int64_t release_file_pages(const torch::Tensor& t) {
#if defined(__linux__)
  if (!t.device().is_cpu() || t.numel() == 0) return 0;
  const auto lo = reinterpret_cast<uintptr_t>(t.data_ptr()), hi = lo + t.numel() * t.element_size();
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)), a = (lo + page - 1) / page * page,
                  b = hi / page * page;
  if (b <= a) return 0;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {  // "start-end perms offset dev inode path"
    std::istringstream f(line);
    std::string range, perms, offset, dev;
    unsigned long long inode = 0;
    f >> range >> perms >> offset >> dev >> inode;
    const size_t dash = range.find('-');
    const uintptr_t s = std::stoull(range.substr(0, dash), nullptr, 16), e = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (a < s || b > e) continue;
    if (inode == 0 || perms.size() < 4 || perms[3] != 'p') return 0;  // not a private file mapping
    return madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) == 0 ? static_cast<int64_t>(b - a) : 0;
  }
#endif
  return 0;
}

// The bytes repack_r16 would make for this part (0: it makes none).
int64_t r16_copy_bytes(int64_t N, int64_t K, int64_t format) {
  return scratchlm::r16_copy_bytes(static_cast<int>(format), N, K);
}

bool has_fixed24() {
#if defined(SCRATCHLM_FIXED24)
  return true;
#else
  return false;
#endif
}

// The block types whose one batch row runs x as 24-bit fixed point in this build (gemv_fixed24.h on AVX512-VNNI,
// gemv_fixed24_avx2.h on AVX2, gemv_fixed24_b32.h with VBMI and BITALG too).
std::vector<std::string> fixed24_types() {
  std::vector<std::string> out;
  auto add = [&](auto blk, const char* name) {
    if (scratchlm::has_fixed24<decltype(blk)>() || scratchlm::has_fixed24_b32<decltype(blk)>()) out.push_back(name);
  };
  add(scratchlm::Q2_KBlock{}, "Q2_K"), add(scratchlm::Q3_KBlock{}, "Q3_K"), add(scratchlm::Q4_KBlock{}, "Q4_K");
  add(scratchlm::Q5_KBlock{}, "Q5_K"), add(scratchlm::Q6_KBlock{}, "Q6_K"), add(scratchlm::Q4_0Block{}, "Q4_0");
  add(scratchlm::Q4_1Block{}, "Q4_1"), add(scratchlm::Q5_0Block{}, "Q5_0"), add(scratchlm::Q5_1Block{}, "Q5_1");
  add(scratchlm::IQ4_NLBlock{}, "IQ4_NL"), add(scratchlm::IQ4_XSBlock{}, "IQ4_XS");
  return out;
}

// Values per power of two of x in gemv_fixed24.h / gemv_fixed24_avx2.h (the K-quants): 32 on AVX512-VNNI, 256 on AVX2
int64_t fixed24_group() { return scratchlm::FIXED24_GROUP; }

bool has_fixed24_b32() {
#if defined(SCRATCHLM_FIXED24_B32)
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The kernels touch no Python object: they release the GIL, so a server's event loop streams the last token
  // while the next step runs (and waits no GIL switch interval for the step to hand it back).
  using nogil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.def("linear_blocks", &linear_blocks, nogil(), "x (B, K) fp32 @ W^T -> (B, N), W (N, K) as bytes in a format code "
        "(r16: its repacked copy, read instead)", pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("N"),
        pybind11::arg("K"), pybind11::arg("format"), pybind11::arg("r16") = pybind11::none());
  m.def("dequantize", &dequantize, nogil(), "block bytes (N rows of K values) in a format code -> fp32 (N, K), the kernels' widening",
        pybind11::arg("w"), pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("format"), pybind11::arg("out") = pybind11::none(),
        pybind11::arg("r16") = pybind11::none());
  m.def("linear_f32", &linear_f32, nogil(), "x (B, K) fp32 @ W (N, K) fp32 ^T -> (B, N)");
  m.def("linear_bf16", &linear_bf16, nogil(), "x (B, K) fp32 @ W (N, K) bf16 ^T -> (B, N)");
  m.def("has_avx512", &has_avx512, "built with the AVX-512 inner loops");
  m.def("set_strassen", &set_strassen, "the prompt GEMM with one level of Strassen-Winograd (true, the "
        "default: 7/8 of the FMAs from 49 tokens) or the plain order; returns the old value");
  m.def("set_fixed24", &set_fixed24, "one batch row of the K-quants Q2_K-Q6_K (and Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS with "
        "VBMI and BITALG) with x as 24-bit fixed point and integer dot products (gemv_fixed24.h, gemv_fixed24_b32.h: "
        "the default where built) or the fp32 kernels; returns the old value");
  m.def("repack_r16", &repack_r16, nogil(), "Q4_K / Q4_0 / Q2_K / Q3_K bytes (N rows, N % 16 == 0, of K values, K % 256 == 0), "
        "format -> the copy one batch row reads, 16 rows interleaved (gemv_r16.h)");
  m.def("release_file_pages", &release_file_pages, nogil(), "drop the resident pages inside a tensor's bytes when "
        "they are a private file mapping's (the GGUF reader's); returns the bytes dropped (0: none)");
  m.def("r16_copy_bytes", &r16_copy_bytes, "N, K, format -> the bytes repack_r16 makes of such a part (0: none)");
  m.def("has_fixed24", &has_fixed24, "built with gemv_fixed24.h (AVX512-VNNI)");
  m.def("fixed24_types", &fixed24_types, "the block types whose one batch row runs x as 24-bit fixed point here");
  m.def("fixed24_group", &fixed24_group, "values per power of two of x in the K-quants' fixed-point kernels (32 with "
        "AVX512-VNNI, 256 on AVX2; the 32-value types' kernel: 32)");
  m.def("has_fixed24_b32", &has_fixed24_b32, "built with gemv_fixed24_b32.h (AVX512-VNNI, VBMI and BITALG)");
  m.def("set_centered", &set_centered, "one batch row of the block types by sub-block sums (gemv_centered.h, "
        "default) or by widening (gemv.h); returns the previous setting (benchmarks compare the two)");
  m.def("simd", &simd, "the inner loops' instruction set: avx512, avx2 or portable");
  m.def("has_vnni", &has_vnni, "the A8 (8-bit activation) kernels use AVX512-VNNI");
  m.def("quantize_act", &quantize_act, nogil(), "x (B, K) fp32 -> (q int8, d fp32 per 32-block)");
  m.def("quantize_act_blocks", &quantize_act_blocks, nogil(), "x (B, K) fp32, qk -> (q int8, d fp32 per qk values): A8 row rounding");
  pybind11::class_<scratchlm::Linear>(m, "Linear")
      .def(pybind11::init<std::vector<int>, std::vector<torch::Tensor>, std::vector<int64_t>, int64_t,
                          std::optional<torch::Tensor>, std::optional<torch::Tensor>, std::optional<torch::Tensor>,
                          std::vector<std::optional<torch::Tensor>>>(),
           pybind11::arg("formats"), pybind11::arg("ws"), pybind11::arg("rows"), pybind11::arg("K"),
           pybind11::arg("in_scale"), pybind11::arg("out_scale"), pybind11::arg("bias"),
           pybind11::arg("r16") = std::vector<std::optional<torch::Tensor>>{})
      .def("forward", &scratchlm::Linear::forward, nogil(), "x (B, K) fp32 -> (B, N) fp32");
  m.def("causal_softmax_bf16", &causal_softmax_bf16, nogil(), "scores (..., T, T) fp32, scale -> causal softmax, bf16");
  m.def("causal_softmax_grad_bf16", &causal_softmax_grad_bf16, nogil(),
        "p bf16, dp fp32 (..., T, T), d fp32 (..., T), scale -> p (dp - d) scale, bf16, 0 above the diagonal");
  m.def("causal_probs_bf16", &causal_probs_bf16, nogil(), "q (N, G T, Hd), k (N, T, Hd) bf16, scale -> causal softmax P bf16");
  m.def("causal_probs_grad_bf16", &causal_probs_grad_bf16, nogil(),
        "p (N, G T, T), dout (N, G T, Hd), v (N, T, Hd) bf16, d (N, G T) fp32, scale -> dS bf16");
  m.def("has_bf16_dot", &has_bf16_dot, "built with AVX512-BF16 dot products (causal_probs_bf16 and its gradient)");
  m.def("cross_entropy_rows_", &cross_entropy_rows_, nogil(),
        "logits (rows, V) fp32/bf16 (overwritten with dL/dx when want_grad), y int64, valid bool, eps, z -> loss (rows,)");
  m.def("rms_norm_rows", &rms_norm_rows, nogil(),
        "x (rows, D) fp32, g (D,) fp32, eps, bf16_out -> (y = x rstd g in fp32 or bf16, rstd (rows,))");
  m.def("rms_norm_rows_grad", &rms_norm_rows_grad, nogil(),
        "x, g, rstd (as the forward's), dy fp32/bf16 (rows, D) -> (dx fp32, dg fp32)");
  m.def("silu_gate", &silu_gate, nogil(), "gate a, up b (same shape, fp32 or bf16) -> silu(a) b in their dtype");
  m.def("silu_gate_grad", &silu_gate_grad, nogil(), "a, b, dh -> (da, db) of h = silu(a) b");
  m.def("rope_rows_", &rope_rows_, nogil(),
        "x (B, H, T, Hd), out (same shape and dtype, any strides), cos, sin (T | B T, Hd) fp32, half, sign: "
        "out <- x cos + sign rot(x) sin");
  m.def("exp_sum", &exp_sum, nogil(), "x (n,) fp32, mx -> (exp(x - mx), its sum): the attention softmax's exps");
  pybind11::class_<scratchlm::LayerSpec>(m, "LayerSpec")
      .def(pybind11::init<int64_t, int64_t, bool, torch::Tensor, torch::Tensor, torch::Tensor>(),
           "window (-1: none), rope (0 global, 1 local, -1 none), pre_norm, qk_gain, attn_out_gain, ffn_out_gain "
           "(empty tensors where absent)");
  pybind11::class_<scratchlm::MoELayer>(m, "MoELayer")
      .def(pybind11::init<scratchlm::Linear, std::vector<scratchlm::Linear>, std::vector<scratchlm::Linear>,
                          torch::Tensor, int64_t, int64_t, bool, int64_t, std::vector<scratchlm::Linear>>(),
           pybind11::arg("router"), pybind11::arg("gate_up"), pybind11::arg("down"), pybind11::arg("gain"),
           pybind11::arg("top_k"), pybind11::arg("router_kind"), pybind11::arg("norm_topk"), pybind11::arg("act"),
           pybind11::arg("shared") = std::vector<scratchlm::Linear>{},
           "router (E, D), gate|up per expert (2F, D), down per expert (D, F), gain (D,) or empty, top_k, router "
           "(0 softmax_topk, 1 topk_softmax), norm_topk, act, shared: [] or the shared expert's gate|up, down, gate");
  pybind11::class_<scratchlm::LlamaStep>(m, "LlamaStep")
      .def(pybind11::init<torch::Tensor, int64_t, int64_t, torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t,
                          double, bool, std::vector<std::vector<scratchlm::Linear>>, scratchlm::Linear,
                          std::vector<scratchlm::LayerSpec>, bool, torch::Tensor, torch::Tensor, torch::Tensor,
                          torch::Tensor, int64_t, int64_t, double, double, double, double,
                          std::vector<scratchlm::MoELayer>, std::vector<int64_t>>(),
           pybind11::arg("embed"), pybind11::arg("embed_format"), pybind11::arg("D"), pybind11::arg("cos"),
           pybind11::arg("sin"), pybind11::arg("H"), pybind11::arg("KvH"), pybind11::arg("Hd"), pybind11::arg("eps"),
           pybind11::arg("half"), pybind11::arg("layers"), pybind11::arg("head"), pybind11::arg("specs"),
           pybind11::arg("qk_projection"), pybind11::arg("cos_local"), pybind11::arg("sin_local"),
           pybind11::arg("cos_long"), pybind11::arg("sin_long"), pybind11::arg("long_after"), pybind11::arg("act"),
           pybind11::arg("embed_scale"), pybind11::arg("attn_softcap"), pybind11::arg("final_softcap"),
           pybind11::arg("logits_scaling"), pybind11::arg("moe") = std::vector<scratchlm::MoELayer>{},
           pybind11::arg("moe_of") = std::vector<int64_t>{})
      .def("step", &scratchlm::LlamaStep::step, nogil())
      .def("chunk", &scratchlm::LlamaStep::chunk, nogil())
      .def("paged", &scratchlm::LlamaStep::paged, nogil());
}
