"""fp32 linear products through oneDNN on CPU: the fast path of `Linear` (ops_impl="fused") and of the fused head.

    forward    y  = x W^T + b                         x (M, K), W (N, K), b (N,), y (M, N)
    backward   dx = dy W,   dW = dy^T x,   db = sum_m dy[m]

The same three products as the reference `x @ W.t()` and its autograd, each computed by oneDNN's fp32 GEMM
(torch.ops.mkldnn._linear_pointwise, the op torch's own inductor emits for CPU linears) instead of the BLAS
that torch's matmul calls (MKL): the same function up to fp32 summation order, no lower precision (tested
against float64 and the reference in tests/unit/test_onednn_linear.py). Why: MKL runs its AVX2 kernels on
AMD CPUs, oneDNN picks the widest the CPU has; on a Zen 5 (AVX-512) the training shapes ran 2.2-2.5x faster
(benchmarks/RESULTS.md, issue #26).

It applies to fp32 tensors on CPU with autocast off and torch built with oneDNN (`applies`); anything else
(bf16 / autocast, which torch already sends to oneDNN; CUDA; empty inputs) takes the reference product.
Gradients are computed only for the inputs that need them (a frozen LoRA base: dx only).
"""

from __future__ import annotations

import torch


# read once at import: torch.compile cannot trace torch.backends.mkldnn.is_available (a graph break in every compiled
# caller, e.g. probs_attention's fp32 scores on CPUs without AVX512-BF16), but reads a module constant
_ONEDNN = bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_available() -> bool:
    """torch was built with oneDNN (mkldnn) and has its linear op."""
    return _ONEDNN


def applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """x @ W^T can run through oneDNN here: both fp32 on CPU, autocast off, non-empty."""
    return (x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == torch.float32
            and w.dtype == torch.float32 and x.numel() > 0 and not torch.is_autocast_enabled("cpu")
            and onednn_available())


# An op of its own (opaque to torch.compile): inductor lowers mkldnn._linear_pointwise only for frozen weights.
@torch.library.custom_op("scratchlm::onednn_mm_nt", mutates_args=())
def _mm_nt_op(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


@_mm_nt_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]))


def mm_nt(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a (M, K) @ b (N, K)^T (+ bias (N,)) -> (M, N) by oneDNN's fp32 GEMM (strided a and b are fine)."""
    return _mm_nt_op(a, b, bias)


class _OneDnnLinear(torch.autograd.Function):
    """y = x W^T + b with forward and backward products through oneDNN (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        ctx.save_for_backward(x2, w)
        ctx.has_bias = b is not None
        return mm_nt(x2, w, b).reshape(*x.shape[:-1], w.shape[0])  # (..., N)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x2, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, w.shape[0])  # (M, N)
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = mm_nt(dy2, w.t()).reshape(*dy.shape[:-1], w.shape[1]) if need_x else None  # (M, N) @ (N, K)
        dw = mm_nt(dy2.t(), x2.t()) if need_w else None  # (N, M) @ (M, K)
        db = dy2.sum(0) if need_b and ctx.has_bias else None
        return dx, dw, db


def reference_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ W (N, K)^T + b, the bias added in the product's dtype: under bf16 autocast the product is
    bf16 and so is the output, as torch's F.linear gives (an fp32 bias would promote it, and every op after it,
    back to fp32)."""
    y = x @ w.t()  # (..., K) @ (K, N) -> (..., N)
    return y if b is None else y + b.to(y.dtype)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ W (N, K)^T + b: through oneDNN when `applies`, else the reference product."""
    if applies(x, w) and (b is None or b.dtype == torch.float32):
        return _OneDnnLinear.apply(x, w, b)
    return reference_linear(x, w, b)
