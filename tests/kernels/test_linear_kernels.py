"""The C++ decode GEMVs compute F.linear(x, W) on exactly the dequantized W (fp32 accumulation).

Reference: float64 x @ W^T with W = gguf-py's dequantization of the same blocks (or the bf16 matrix
widened); tolerance: fp32 summation error over K terms. The pure-torch fallback (no native kernels)
is checked the same way, and PackedLinear's `dequantized()` is the matrix every format computes with.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from scratchlm.generate import packed_linear
from scratchlm.generate.packed_linear import PackedLinear
from scratchlm.kernels import ops
from scratchlm.kernels.build import native
from scratchlm.quant.quantize import quantize_blocks




def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().T).float()


def tol(x: torch.Tensor, w: torch.Tensor) -> float:
    """fp32 rounding bound of a K-term dot product: K * eps * sum |x_k w_k| (loose, K-independent form)."""
    return 1e-6 * float((x.abs().double() @ w.abs().double().T).max()) + 1e-7


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("b", [1, 3, 8])
def test_block_kernels_equal_linear_on_dequantized(kernels, ggml_type: str, b: int) -> None:
    g = torch.Generator().manual_seed(b)
    w = torch.randn(37, 96, generator=g) * 0.1
    blocks = quantize_blocks(w, ggml_type)
    wd = torch.from_numpy(dequantize(blocks.data.numpy(), GGMLQuantizationType[ggml_type]))
    x = torch.randn(b, 96, generator=g)
    got = ops.linear_blocks(kernels, x, blocks)
    assert got.dtype == torch.float32 and got.shape == (b, 37)
    assert (got - reference(x, wd)).abs().max() <= tol(x, wd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b", [1, 5])
def test_dense_kernels_equal_linear(kernels, dtype: torch.dtype, b: int) -> None:
    g = torch.Generator().manual_seed(b)
    w = (torch.randn(70, 48, generator=g) * 0.1).to(dtype)
    x = torch.randn(b, 48, generator=g)
    fn = kernels.linear_f32 if dtype == torch.float32 else kernels.linear_bf16
    got = fn(x, w)
    assert (got - reference(x, w.float())).abs().max() <= tol(x, w.float())


def on_one_and_two_threads(fn):
    """fn() run with torch on 1 thread, then on 2 (the thread count restored after)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fn()
        torch.set_num_threads(2)
        return one, fn()
    finally:
        torch.set_num_threads(before)


def test_kernels_split_rows_over_threads(kernels) -> None:
    """A matrix big enough to be split between threads gives the same rows as one thread."""
    w = torch.randn(3000, 256) * 0.05
    blocks = quantize_blocks(w, "Q4_1")
    x = torch.randn(2, 256)
    one, two = on_one_and_two_threads(lambda: ops.linear_blocks(kernels, x, blocks))
    assert torch.equal(one, two)


def test_kernels_reject_bad_arguments(kernels) -> None:
    blocks = quantize_blocks(torch.randn(4, 64), "Q8_0")
    with pytest.raises(RuntimeError, match="columns"):
        ops.linear_blocks(kernels, torch.randn(1, 32), blocks)
    with pytest.raises(RuntimeError, match="fp32"):
        ops.linear_blocks(kernels, torch.randn(1, 64, dtype=torch.float64), blocks)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels.linear_f32(torch.randn(1, 40), torch.randn(3, 40))
    with pytest.raises(ValueError, match="Q6_K"):
        ops.linear_blocks(kernels, torch.randn(1, 64), type(blocks)("Q6_K", blocks.data, blocks.shape))


@pytest.mark.parametrize("native_on", [True, False])
@pytest.mark.parametrize("quant", ["bf16", "q8_0", "q4_1"])
def test_packed_linear_formats_compute_their_dequantized_matrix(monkeypatch, quant: str, native_on: bool) -> None:
    """Every format (kernel or pure-torch fallback) == F.linear with `dequantized()`, scales and bias included."""
    if native_on and native() is None:
        pytest.skip("no native kernels on this machine")
    if not native_on:
        monkeypatch.setattr(packed_linear.ops, "native_kernels", lambda: None)
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(40, 64, generator=g) * 0.2, torch.randn(40, generator=g)
    in_scale, out_scale = torch.rand(64, generator=g) + 0.5, torch.rand(40, generator=g) + 0.5
    if quant == "bf16":
        lin = PackedLinear(w, bias, torch.float32, "bf16")
        assert torch.equal(lin.dequantized(), w.bfloat16().float())
    else:
        blocks = quantize_blocks(w, quant.upper())
        lin = PackedLinear(None, bias, torch.float32, quant, blocks, in_scale, out_scale)
    assert (lin.native is not None) == native_on
    x = torch.randn(3, 64, generator=g)
    ref = F.linear(x.double(), lin.dequantized().double(), bias.double()).float()
    torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin.residual(x[:, :40], x), x[:, :40] + ref, rtol=1e-5, atol=1e-5)
