"""Cross entropy fused with the LM head, over chunks of positions: no (N, V) logits tensor is ever whole.

Shapes: h (N, D) final hidden states, W (V, D) the head's weight, targets (N,); C = rows per chunk.
For each chunk of C positions (the same math as train/losses.py, per row i):
    x      = h_c W^T                                  (C, V) logits, fp32 (bf16 matmul under autocast)
    lse_i  = m_i + log sum_v exp(x_iv - m_i)
    loss_i = (1 - eps) (lse_i - x_iy) + eps (lse_i - mean_v x_iv) + z lse_i^2        (0 where y = ignore)
and, because the loss is a sum of per-row terms, its gradient is known right there:
    dx     = p (1 + 2 z lse) - (1 - eps) onehot(y) - eps / V,    p = softmax(x)     (0 on ignored rows)
    dh_c   = dx W,        dW += dx^T h_c
The forward returns sum_i loss_i and keeps dh (N, D) and dW (V, D); backward only scales them by the
incoming gradient (a scalar). So the head costs the same three matmuls as the unfused path, but its
(N, V) logits, their softmax and their gradient (3 x 201 MB for 1024 positions of a 49k vocabulary)
become one reused C x V buffer. dW is skipped when W does not train (LoRA), dh when h does not.
`linear_cross_entropy` is the entry point: reduction "mean" (over counted rows) or "sum"; tested equal
(values and gradients) to cross_entropy(h @ W.T, targets) in tests/unit/test_chunked_ce.py.
fused=True (the model's ops_impl="fused"): the three fp32 products through oneDNN (nn/onednn_linear.py), dW
accumulated transposed (dW^T += h_c^T dx_c: oneDNN's blocking runs that form 1.1-1.7x faster) and chunks of
128 MB by default (the products' inner size C: 170 -> 682 rows of a 49k vocabulary ran dh and dW 1.2-1.6x faster);
and, where the native kernels are built, each chunk's loss and dx in one C++ pass per row in the logits' own
dtype (kernels/csrc/cross_entropy_rows.h; under bf16 autocast no fp32 copy of the chunk, no cast back).
"""

from __future__ import annotations

import torch

from scratchlm.kernels.build import native, native_ready
from scratchlm.nn import onednn_linear

DEFAULT_CHUNK_BYTES = 32 << 20  # one fp32 logits chunk; 170 rows of a 49k vocabulary, 1024 of an 8k one
FUSED_CHUNK_BYTES = 128 << 20  # fused=True (the oneDNN products): 682 rows of a 49k vocabulary


def chunk_rows(vocab_size: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Positions per chunk: the fp32 (C, V) logits fit chunk_bytes, at least 16 rows."""
    return max(16, chunk_bytes // (4 * vocab_size))


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmuls run in: autocast's when it is on for t's device, else t's own."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


@torch.library.custom_op("scratchlm::cross_entropy_rows_", mutates_args=("x",))
def _rows_native(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor, eps: float, z: float,
                 want_grad: bool) -> torch.Tensor:
    """_chunk_loss_and_grad in one C++ pass per row (kernels/csrc/cross_entropy_rows.h): x fp32 or bf16, kept in
    its dtype (dx overwrites it), so a bf16 chunk is never widened to an fp32 copy."""
    return native().cross_entropy_rows_(x, y, valid, eps, z, want_grad)


@_rows_native.register_fake
def _(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor, eps: float, z: float, want_grad: bool) -> torch.Tensor:
    return x.new_empty(x.shape[0], dtype=torch.float32)


def _chunk_loss_and_grad(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor, eps: float, z: float,
                         want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row loss (C,) of logits x (C, V) fp32 (overwritten) and, when want_grad, dL/dx (C, V) in x's memory."""
    m = x.amax(dim=-1, keepdim=True)  # (C, 1)
    x_y = x.gather(-1, y[:, None]).squeeze(-1)  # (C,)
    mean_x = x.mean(dim=-1) if eps else None
    e = x.sub_(m).exp_()  # (C, V) exp(x - m), in place
    s = e.sum(dim=-1)  # (C,)
    lse = s.log() + m.squeeze(-1)  # (C,)
    loss = lse - x_y if not eps else (1.0 - eps) * (lse - x_y) + eps * (lse - mean_x)
    if z:
        loss = loss + z * lse.square()
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if not want_grad:
        return loss, None
    coef = 1.0 / s  # (C,): p = e / s
    if z:
        coef = coef * (1.0 + 2.0 * z * lse)
    dx = e.mul_(torch.where(valid, coef, torch.zeros_like(coef))[:, None])  # (C, V) p (1 + 2 z lse), 0 if ignored
    if eps:
        dx.sub_(torch.where(valid, eps / x.shape[-1], 0.0)[:, None])
    dx.scatter_add_(-1, y[:, None], torch.where(valid, -(1.0 - eps), 0.0)[:, None].to(dx.dtype))
    return loss, dx


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i loss_i of targets under softmax(h W^T), chunk by chunk (module docstring)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, ignore_index: int, eps: float,
                z: float, rows: int, need_h: bool, need_w: bool, fused: bool) -> torch.Tensor:
        want_grad = need_h or need_w
        cd = _compute_dtype(h)
        w_c = w.to(cd)
        onednn = fused and cd == torch.float32 and onednn_linear.applies(h, w_c)
        mm_nt = onednn_linear.mm_nt if onednn else (lambda a, b: a @ b.t())  # a (M, K) @ b (N, K)^T
        grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device) if want_grad and need_h else None
        # dW, or on the oneDNN path dW^T (D, V) (returned as its transposed view)
        w_shape = w.shape[::-1] if onednn else w.shape
        grad_w = torch.zeros(w_shape, dtype=torch.float32, device=w.device) if want_grad and need_w else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        native_rows = (fused and h.device.type == "cpu" and cd in (torch.float32, torch.bfloat16)
                       and native_ready())
        for s in range(0, h.shape[0], rows):
            h_c = h[s:s + rows].to(cd)  # (C, D)
            y = targets[s:s + rows]
            valid = y != ignore_index
            safe_y = torch.where(valid, y, torch.zeros_like(y))
            x = mm_nt(h_c, w_c)  # (C, V) in the compute dtype
            if native_rows and x.is_contiguous():
                loss = _rows_native(x, safe_y.contiguous(), valid.contiguous(), eps, z, want_grad)
                dx = x if want_grad else None  # dL/dx in x's memory and dtype
            else:
                loss, dx = _chunk_loss_and_grad(x.float(), safe_y, valid, eps, z, want_grad)
            total += loss.sum()
            if dx is not None:
                dx_c = dx.to(cd)
                if grad_h is not None:
                    grad_h[s:s + rows] = mm_nt(dx_c, w_c.t())  # (C, V) @ (V, D)
                if grad_w is not None and onednn:
                    grad_w += mm_nt(h_c.t(), dx_c.t())  # (D, C) @ (C, V): dW^T
                elif grad_w is not None:
                    grad_w += mm_nt(dx_c.t(), h_c.t()).float()  # (V, C) @ (C, D)
        if grad_w is not None and onednn:
            grad_w = grad_w.t()  # (V, D)
        ctx.save_for_backward(grad_h if grad_h is not None else torch.empty(0),
                              grad_w if grad_w is not None else torch.empty(0))
        ctx.dtypes = (h.dtype, w.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        dh = (grad_h * grad_out).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        dw = (grad_w * grad_out).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return dh, dw, None, None, None, None, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                         label_smoothing: float = 0.0, z_loss: float = 0.0, reduction: str = "mean",
                         chunk_size: int | None = None, fused: bool = False) -> torch.Tensor:
    """cross_entropy(h @ weight.T, targets) without whole logits. h (..., D), weight (V, D), targets (...).

    reduction "mean" (over positions whose target is not ignore_index; NaN when none are, as torch) or
    "sum"; chunk_size = positions per chunk (default chunk_rows(V)); fused: fp32 products through oneDNN."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy reduction={reduction!r} is not one of ('mean', 'sum')")
    if not 0.0 <= label_smoothing <= 1.0 or z_loss < 0:
        raise ValueError(f"need 0 <= label_smoothing <= 1 and z_loss >= 0, got {label_smoothing}, {z_loss}")
    if h.shape[:-1] != targets.shape or h.shape[-1] != weight.shape[-1]:
        raise ValueError(f"h {tuple(h.shape)}, weight {tuple(weight.shape)} and targets {tuple(targets.shape)} "
                         "disagree: h is targets.shape + (D,), weight (V, D)")
    flat_h, flat_y = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    rows = chunk_size or chunk_rows(weight.shape[0], FUSED_CHUNK_BYTES if fused else DEFAULT_CHUNK_BYTES)
    grad = torch.is_grad_enabled()
    total = _LinearCrossEntropy.apply(flat_h, weight, flat_y, ignore_index, float(label_smoothing), float(z_loss),
                                      rows, grad and flat_h.requires_grad, grad and weight.requires_grad, fused)
    if reduction == "sum":
        return total
    return total / (flat_y != ignore_index).sum()
