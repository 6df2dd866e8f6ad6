"""One batch row of the K-quants Q2_K-Q6_K through gemv_fixed24.h (AVX512-VNNI builds), of Q5_K / Q6_K through
gemv_fixed24_avx2.h (AVX2 builds: vpmaddubsw / vpmaddwd) and of Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS through
gemv_fixed24_b32.h (VNNI, VBMI and BITALG): x as 24-bit fixed point per 32 values, integer dot products. Each type
runs where the build has its kernel (`fixed24_types()`), and skips elsewhere (absent hardware).

Checked against float64 on the dequantized matrix (quant/dequantize.py), with x rounded by a torch model written
here from the method's definition (not from the kernel's code):
  X = round_half_even(x 2^k) per 32-value block, k the largest with max |x| 2^k <= 2^23 - 2^16
- the kernel equals float64 x~ @ W^T (x~ = X 2^-k) within the fp32 summation bound of the other kernel tests;
- against the unrounded x it stays within that bound plus the rounding's own: sum_i |w_i| max_b |x| / (2^23 - 2^16);
- blocks of zeros, tiny (subnormal) and huge values, outlier channels; inf in x gives a non-finite y as fp32 does;
- the switch (set_fixed24) restores the fp32 kernels, whose results match float64 the same way.
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.kernels import ops
from scratchlm.kernels.build import native
from scratchlm.quant.dequantize import dequantize_blocks
from tests.kernels.test_block_types import llama_cpp_blocks, random_blocks, tol

TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]
BLOCKS32 = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]  # gemv_fixed24_b32.h, with IQ4_XS
FIXED_MAX = 2**23 - 2**16


@pytest.fixture(scope="module")
def kernels():
    mod = native()
    if mod is None or not mod.fixed24_types():
        pytest.skip("the fixed-point kernels need the compiled kernels on an AVX2 or AVX512-VNNI CPU")
    return mod


def needs_kernel(kernels, type_name: str) -> None:
    if type_name not in kernels.fixed24_types():
        pytest.skip(f"no fixed-point kernel for {type_name} on this CPU (Q2_K / Q3_K / Q4_K: AVX512-VNNI; the "
                    "32-value types: AVX512-VNNI, VBMI and BITALG)")


def group(kernels, type_name: str) -> int:
    """Values per power of two: the K-quants' kernel's (32 with AVX512-VNNI, a 256-value super-block on AVX2), 32 for
    the 32-value types' kernel."""
    return 32 if type_name in BLOCKS32 + ["IQ4_XS"] else kernels.fixed24_group()


def rounded(x: torch.Tensor, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(x~, per-value max |x| of its block of `size` values) in float64, x (K,) fp32."""
    blocks = x.double().reshape(-1, size)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    _, e = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1)
    k = (23 - e).double()
    k = torch.where(amax * 2.0**k > FIXED_MAX, k - 1, k)
    xr = torch.where(amax > 0, torch.round(blocks * 2.0**k) * 2.0**-k, torch.zeros_like(blocks))
    return xr.reshape(-1), amax.expand_as(blocks).reshape(-1)


def activations(k: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    plain = torch.randn(k, generator=g)
    outliers = plain.clone()
    outliers[::97] *= 1000.0  # a few channels far above the rest, as LLM activations have
    mixed = torch.randn(k, generator=g)
    mixed[:32] = 0.0  # a block of zeros
    mixed[32:64] *= 1e-39  # subnormal values
    mixed[64:96] *= 1e20  # large (products stay finite in fp32 against the random blocks up to ~3e8)
    return [plain, outliers, mixed]


@pytest.mark.parametrize("source", ["random", "llama.cpp"])
@pytest.mark.parametrize("type_name", TYPES)
def test_fixed24_equals_rounded_x_in_float64(kernels, type_name: str, source: str) -> None:
    needs_kernel(kernels, type_name)
    maker = random_blocks if source == "random" else llama_cpp_blocks
    shapes = [(13, 512), (37, 2048)]  # row tiles of 4 and a remainder; two and eight super-blocks / 128-value steps
    if type_name in BLOCKS32:
        shapes += [(6, 96), (5, 576), (9, 1504)]  # the last step of 3, 2, 1 blocks (32 values each)
    for n, k in shapes:
        blocks = maker(type_name, n, k, seed=3)
        w = dequantize_blocks(blocks).double()
        for x in activations(k, seed=n):
            got = ops.linear_blocks(kernels, x[None], blocks)[0].double()
            xr, amax = rounded(x, group(kernels, type_name))
            err = float((got - w @ xr).abs().max())
            assert err <= tol(xr[None].float(), w.float()), (type_name, err)
            # against the unrounded x: plus the rounding's bound
            bound = float((w.abs() @ amax).max()) / FIXED_MAX + tol(x[None], w.float())
            assert float((got - w @ x.double()).abs().max()) <= bound


@pytest.mark.parametrize("type_name", TYPES)
def test_fixed24_switch_and_non_finite_x(kernels, type_name: str) -> None:
    needs_kernel(kernels, type_name)
    blocks = llama_cpp_blocks(type_name, 13, 512, seed=4)
    w = dequantize_blocks(blocks).double()
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(5))
    before = kernels.set_fixed24(False)
    assert before is True  # the default where built; restored below
    try:
        off = ops.linear_blocks(kernels, x, blocks)  # the fp32 kernels (gemv_centered512.h / gemv.h)
    finally:
        kernels.set_fixed24(True)
    on = ops.linear_blocks(kernels, x, blocks)
    ref = x.double() @ w.T
    assert float((off.double() - ref).abs().max()) <= tol(x, w.float())
    assert not torch.equal(on, off)  # the switch changes the route (different roundings)
    x[0, 40] = float("inf")
    assert not bool(torch.isfinite(ops.linear_blocks(kernels, x, blocks)).any())
