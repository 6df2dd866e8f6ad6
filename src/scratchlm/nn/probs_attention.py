"""Causal self-attention with the probabilities materialised: sdpa_attention's path for bf16 training at short T.

    forward    S = Q K^T (fp32)     P = softmax(c S + causal)  (bf16)     O = P V
    backward   dV = P^T dO     dP = dO V^T (fp32)     D = rowsum(dO * O)     dS = c P (dP - D)  (bf16)
               dQ = dS K       dK = dS^T Q

Shapes: q (B, H, T, Hd), k, v (B, KvH, T, Hd); the G = H / KvH query heads of a kv head are stacked as rows,
qg (B, KvH, G T, Hd), so S (B, KvH, G T, T) and no k / v copy is made for GQA.

The same function as the reference attention (nn/attention.py) with torch's flash kernel's roundings: products
of bf16 values accumulated in fp32 for S and dP, P and dS rounded to bf16 before their products. Why: at the
llama-small training shape (T 256, Hd 64) torch's CPU flash attention took ~19 ms per layer forward and
backward in bf16, while its six products run in ~4 ms as whole bf16 / fp32 GEMMs; the softmax and its gradient
are one pass each in C++ (kernels/csrc/causal_softmax.h; torch's elementwise ops took five to eight passes). On
CPUs with AVX512-BF16 the two fp32 products (S and dP) are computed inside those passes too, by bf16 dot products
that add exact products in fp32 (kernels/csrc/attention_scores.h): no fp32 copies of q, k, dO, v, no per-head GEMMs.
The cost is memory: P (B H T^2 bf16 values) is kept for backward, and dS (and on the GEMM route S, dP in fp32)
live while a layer runs, so the path applies below SCORE_BUDGET values (flash attention keeps O(T) per row) — and only with the native kernels built, bf16 inputs on CPU, a causal mask
and nothing else (no extra mask, no soft-capping, T queries over T keys). Tested against float64 attention in
tests/unit/test_probs_attention.py.
"""

from __future__ import annotations

import torch

from scratchlm.kernels.build import native, native_ready
from scratchlm.nn.onednn_linear import mm_nt, onednn_available

SCORE_BUDGET = 1 << 24  # B * H * T * T at most: 32 MB of bf16 P kept per layer for backward (T 512 at B H 64)


@torch.library.custom_op("scratchlm::causal_softmax_bf16", mutates_args=())
def causal_softmax(s: torch.Tensor, scale: float) -> torch.Tensor:
    """s (..., G T, T) fp32 raw scores -> softmax(scale s) under the causal mask (row r sees keys <= r % T), bf16."""
    return native().causal_softmax_bf16(s.contiguous(), scale)


@causal_softmax.register_fake
def _(s: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(s, dtype=torch.bfloat16)


@torch.library.custom_op("scratchlm::causal_softmax_grad_bf16", mutates_args=())
def causal_softmax_grad(p: torch.Tensor, dp: torch.Tensor, d: torch.Tensor, scale: float) -> torch.Tensor:
    """dS = scale P (dP - D) (bf16; 0 above the diagonal): the gradient of the raw scores."""
    return native().causal_softmax_grad_bf16(p.contiguous(), dp.contiguous(), d.contiguous(), scale)


@causal_softmax_grad.register_fake
def _(p: torch.Tensor, dp: torch.Tensor, d: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(p)


def bf16_dot_ready() -> bool:
    """The native kernels have AVX512-BF16 dot products: the scores fused with the softmax."""
    return native_ready("bf16_dot")


@torch.library.custom_op("scratchlm::causal_probs_bf16", mutates_args=())
def causal_probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """q (N, G T, Hd), k (N, T, Hd) bf16 -> causal_softmax(q k^T, scale), the scores by bf16 dot products in C++."""
    return native().causal_probs_bf16(q.contiguous(), k.contiguous(), scale)


@causal_probs.register_fake
def _(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], k.shape[1])


@torch.library.custom_op("scratchlm::causal_probs_grad_bf16", mutates_args=())
def causal_probs_grad(p: torch.Tensor, dout: torch.Tensor, v: torch.Tensor, d: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """causal_softmax_grad(p, dout v^T, d, scale), the products by bf16 dot products in C++."""
    return native().causal_probs_grad_bf16(p.contiguous(), dout.contiguous(), v.contiguous(), d.contiguous(), scale)


@causal_probs_grad.register_fake
def _(p: torch.Tensor, dout: torch.Tensor, v: torch.Tensor, d: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(p)


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
            softcap: float | None) -> bool:
    """This path computes the call (see the module docstring for the conditions)."""
    if mask is not None or not is_causal or softcap is not None or q.dim() != 4:
        return False
    b, h, t, _ = q.shape
    return (all(x.dtype == torch.bfloat16 and x.device.type == "cpu" for x in (q, k, v))
            and k.shape[-2] == t and k.shape[:2] == v.shape[:2] and h % k.shape[1] == 0
            and 0 < b * h * t * t <= SCORE_BUDGET and native_ready())


def scores_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (N, M, Hd) @ b (N, S, Hd)^T in fp32 (bf16 operands widened exactly): oneDNN per head where torch has it."""
    a, b = a.float(), b.float()
    if not onednn_available():
        return a @ b.transpose(-1, -2)
    return torch.stack([mm_nt(a[i], b[i]) for i in range(a.shape[0])])


class ProbsAttention(torch.autograd.Function):
    """(q, k, v, scale) -> O (B, H, T, Hd) with the products and roundings of the module docstring."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        b, h, t, hd = q.shape
        kvh = k.shape[1]
        with torch.autocast("cpu", enabled=False):
            qg = q.reshape(b * kvh, (h // kvh) * t, hd)  # (B KvH, G T, Hd)
            kf, vf = k.reshape(b * kvh, t, hd), v.reshape(b * kvh, t, v.shape[-1])
            if bf16_dot_ready() and qg.shape[-1] % 2 == 0:
                p = causal_probs(qg, kf, scale)  # (B KvH, G T, T) bf16, the scores fused
            else:
                p = causal_softmax(scores_fp32(qg, kf), scale)
            o = p @ vf  # (B KvH, G T, Hd_v)
        ctx.save_for_backward(qg, kf, vf, p, o)
        ctx.scale, ctx.shape = scale, (b, h, t, v.shape[-1])
        return o.view(ctx.shape)

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        qg, kf, vf, p, o = ctx.saved_tensors
        b, h, t, hdv = ctx.shape
        with torch.autocast("cpu", enabled=False):
            dog = do.to(o.dtype).reshape(o.shape)  # (B KvH, G T, Hd_v)
            dv = p.transpose(-1, -2) @ dog  # sums the G query heads of each kv head
            d = (dog.float() * o.float()).sum(-1)  # (B KvH, G T)
            if bf16_dot_ready() and vf.shape[-1] % 2 == 0:
                ds = causal_probs_grad(p, dog, vf, d, ctx.scale)  # dP = dO V^T fused
            else:
                ds = causal_softmax_grad(p, scores_fp32(dog, vf), d, ctx.scale)
            dq = (ds @ kf).view(b, h, t, qg.shape[-1])
            dk = (ds.transpose(-1, -2) @ qg).view(b, -1, t, qg.shape[-1])
        return dq, dk, dv.view(b, -1, t, hdv), None


def probs_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q (B, H, T, Hd) over k, v (B, KvH, T, Hd) at `scale` (callers check `applies`)."""
    return ProbsAttention.apply(q, k, v, scale)
