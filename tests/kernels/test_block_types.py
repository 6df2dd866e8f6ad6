"""The exact decode kernels of every ggml type read the same matrix quant/dequantize.py reads, bit for bit.

Per type (F32, F16, BF16 and every block type of quant/dequantize.py), on random blocks (random bytes, the
f16 scale fields any finite f16: subnormals, zeros, negatives, up to 65504) and on blocks written by
llama.cpp's own quantizer (tests/quant/ggml_c_lib.py):
- the kernels' widening equals dequantize_blocks bit for bit (torch.equal), seen two ways: the debug entry
  `dequantize` (the same chunk code the GEMVs run) and the GEMV itself on one-hot rows (x = I: y = W^T exactly);
- the GEMV equals float64 x @ W^T (W = dequantize_blocks) for every batch size 1..8 within the fp32
  summation bound 1e-6 * max_n sum_k |x_k w_nk| + 1e-7 (as tests/kernels/test_linear_kernels.py), one batch
  row of the types gemv_centered.h takes both ways (its sub-block sums, and gemv.h's widening switched on);
- PackedLinear over parts of different types (scales, bias, residual) with and without the compiled
  kernels (SCRATCHLM_KERNELS=0's path: F.linear on the dequantized parts) is the same function.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.generate import packed_linear
from scratchlm.generate.packed_linear import PackedLinear
from scratchlm.kernels import ops
from scratchlm.kernels.build import native
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import KERNEL_TYPES, dequantize_blocks
from scratchlm.quant.ggml_types import FLOAT_TYPES, GGML
from tests.kernels.test_linear_kernels import on_one_and_two_threads
from tests.quant.ggml_c_lib import quantize as c_quantize

BLOCK_TYPES = [t for t in KERNEL_TYPES if t not in FLOAT_TYPES]
# byte offsets of each block type's f16 fields (d, and m / dmin where the type has one): ggml-common.h
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "IQ4_NL": (0,),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}
N = 13  # odd: row tiles and a remainder


def width(type_name: str) -> int:
    """K: two blocks of a K-quant, nine 32-blocks (gemv_centered.h's group of 8 and a partial one), 48 dense
    values (not a multiple of 32)."""
    return {1: 48, 32: 288, 256: 512}[GGML[type_name].block_size]


def finite_f16(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Random f16 bit patterns (uint8 pairs) with the all-ones exponent (inf / NaN) cleared."""
    bits = torch.randint(0, 1 << 16, shape, generator=g, dtype=torch.int32)
    bits = torch.where((bits >> 10) & 31 == 31, bits ^ 0x4000, bits)
    return bits.to(torch.int16).view(torch.uint8).reshape(*shape[:-1], shape[-1] * 2)


def random_blocks(type_name: str, n: int, k: int, seed: int = 0) -> GGMLBlocks:
    """Random bytes in every field, f16 fields finite; dense types: random finite values."""
    g = torch.Generator().manual_seed(seed)
    t = GGML[type_name]
    if type_name == "F32":
        return GGMLBlocks("F32", (torch.randn(n, k, generator=g) * 10).view(torch.uint8), (n, k))
    if type_name == "F16":
        return GGMLBlocks("F16", finite_f16(g, (n, k)), (n, k))
    if type_name == "BF16":
        return GGMLBlocks("BF16", (torch.randn(n, k, generator=g) * 10).bfloat16().view(torch.uint8), (n, k))
    nblk = n * k // t.block_size
    data = torch.randint(0, 256, (nblk, t.type_size), generator=g, dtype=torch.uint8)
    for off in F16_FIELDS[type_name]:
        data[:, off:off + 2] = finite_f16(g, (nblk, 1))
    return GGMLBlocks(type_name, data.reshape(n, -1).contiguous(), (n, k))


def llama_cpp_blocks(type_name: str, n: int, k: int, seed: int = 0) -> GGMLBlocks:
    """A Gaussian matrix with outliers, quantized by llama.cpp (dense types: converted)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[rng.random(w.shape) < 0.02] *= 8
    if type_name in FLOAT_TYPES:
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
        return GGMLBlocks(type_name, torch.from_numpy(w).to(dtype).view(torch.uint8).contiguous(), (n, k))
    return GGMLBlocks(type_name, torch.from_numpy(c_quantize(w, type_name)), (n, k))


SOURCES = {"random": random_blocks, "llama.cpp": llama_cpp_blocks}


def tol(x: torch.Tensor, w: torch.Tensor) -> float:
    """fp32 rounding bound of K-term dot products: 1e-6 * max sum_k |x_k w_nk| + 1e-7 (loose, K-independent)."""
    return 1e-6 * float((x.abs().double() @ w.abs().double().T).max()) + 1e-7


def test_every_dequantized_type_has_a_kernel() -> None:
    assert set(KERNEL_TYPES) == set(GGML) and set(ops.FORMAT_CODES) >= set(KERNEL_TYPES)


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("type_name", KERNEL_TYPES)
def test_kernel_widening_is_dequantize_bit_for_bit(kernels, type_name: str, source: str) -> None:
    blocks = SOURCES[source](type_name, N, width(type_name))
    want = dequantize_blocks(blocks)
    assert bool(torch.isfinite(want).all())
    if type_name not in FLOAT_TYPES:
        assert torch.equal(ops.dequantize(kernels, blocks), want)
    # the prompt GEMM on one-hot rows: y[k, n] = 1 * w[n, k] + zeros, exact in the plain order (Strassen-Winograd's
    # sums of weights round: within the fp32 bound, tests/kernels/test_strassen.py)
    before = kernels.set_strassen(False)
    try:
        assert torch.equal(ops.linear_blocks(kernels, torch.eye(blocks.shape[1]), blocks).T, want)
    finally:
        kernels.set_strassen(before)


@pytest.mark.parametrize("centered", [True, False])
@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("type_name", KERNEL_TYPES)
def test_kernels_equal_linear_on_dequantized(kernels, type_name: str, source: str, centered: bool) -> None:
    """centered: one batch row of Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K by gemv_centered.h's sub-block sums
    (the default on AVX2) or, switched off, by gemv.h's widening like every other type and batch size."""
    before = kernels.set_centered(centered)
    assert before is True  # the default, restored below
    try:
        check_linear_on_dequantized(kernels, type_name, source)
    finally:
        kernels.set_centered(True)


def check_linear_on_dequantized(kernels, type_name: str, source: str) -> None:
    blocks = SOURCES[source](type_name, N, width(type_name), seed=1)
    w = dequantize_blocks(blocks)
    g = torch.Generator().manual_seed(2)
    for b in range(1, 9):  # every tile width: 1-2 rows, 3-8 in one tile on AVX2 (4 and two tiles elsewhere)
        x = torch.randn(b, blocks.shape[1], generator=g)
        got = ops.linear_blocks(kernels, x, blocks)
        assert got.dtype == torch.float32 and got.shape == (b, N)
        err = float((got.double() - x.double() @ w.double().T).abs().max())
        assert err <= tol(x, w), (b, err, tol(x, w))


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_prompt_gemm_equals_linear_on_dequantized(kernels, type_name: str) -> None:
    """From GEMM_MIN_ROWS (9) batch rows the blocks go through block_gemm.h (x packed in 16-token tiles, W
    widened in 256-column slices, 6-row (AVX2) / 12-row (AVX-512) micro-kernels): == float64 x @ W^T within the
    fp32 bound, for 9-120 rows (partial token tiles; 120 x K packs its tiles on several threads), 13 and 23 weight
    rows (remainder groups of 1, 5 and 11 rows) and K over two slices (a partial one for the 32-value types); every
    row the same bits whatever the batch size (each (token, row) sum has one fixed order) with the Strassen-Winograd
    level off (from 49 tokens it pairs tokens: tests/kernels/test_strassen.py)."""
    k = 512 if GGML[type_name].block_size == 256 else 288
    for n_rows in (N, 23):
        blocks = llama_cpp_blocks(type_name, n_rows, k, seed=3)
        w = dequantize_blocks(blocks)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(120, k, generator=g) * torch.rand(120, 1, generator=g) * 4
        got = {b: ops.linear_blocks(kernels, x[:b], blocks) for b in (9, 29, 40, 120)}
        for b, y in got.items():
            err = float((y.double() - x[:b].double() @ w.double().T).abs().max())
            assert err <= tol(x[:b], w), (n_rows, b, err, tol(x[:b], w))
        before = kernels.set_strassen(False)
        try:
            plain = {b: ops.linear_blocks(kernels, x[:b], blocks) for b in (9, 29, 40, 120)}
        finally:
            kernels.set_strassen(before)
        assert all(torch.equal(plain[120][:b], plain[b]) for b in (9, 29, 40))
        assert all(torch.equal(plain[b], got[b]) for b in (9, 29, 40))  # below 49 tokens: the plain order


def test_k_quants_need_whole_super_blocks(kernels) -> None:
    short = GGMLBlocks("Q6_K", torch.zeros(4, 34, dtype=torch.uint8), (4, 64))  # 64 values: no whole super-block
    with pytest.raises(ValueError, match=r"Q6_K.*multiple of 256"):
        ops.linear_blocks(kernels, torch.randn(1, 64), short)
    assert not ops.fits(short) and not ops.fits(GGMLBlocks("F16", torch.zeros(2, 40, dtype=torch.uint8), (2, 20)))
    assert ops.fits(llama_cpp_blocks("Q4_K", 4, 256))


def mixed_parts(seed: int = 0) -> tuple[GGMLBlocks, ...]:
    """Row parts of one 512-wide matrix in five types (as a GGUF's q / k / v ... mix them); the first has 37 rows,
    so a prompt GEMM stores it 16 rows at a time (two register transposes) and 5 one by one."""
    types = ("Q4_K", "Q6_K", "Q5_0", "F32", "IQ4_XS")
    return tuple(llama_cpp_blocks(t, 37 if i == 0 else 5 + i, 512, seed + i) for i, t in enumerate(types))


@pytest.mark.parametrize("native_on", [True, False])
def test_packed_linear_over_parts_of_every_kind(monkeypatch, native_on: bool) -> None:
    """Parts in different types, in/out scales, bias, residual: kernels or the pure-torch fallback ==
    F.linear on the stacked dequantized parts."""
    if native_on and native() is None:
        pytest.skip("no native kernels on this machine")
    if not native_on:
        monkeypatch.setattr(packed_linear.ops, "native_kernels", lambda: None)
    parts = mixed_parts()
    n = sum(p.shape[0] for p in parts)
    g = torch.Generator().manual_seed(0)
    bias, in_scale, out_scale = torch.randn(n, generator=g), torch.rand(512, generator=g) + 0.5, torch.rand(n, generator=g) + 0.5
    lin = PackedLinear(None, bias, torch.float32, "gguf", parts, in_scale, out_scale)
    assert (lin.native is not None) == native_on and lin.blocks is None and len(lin.parts) == 5
    w = torch.cat([dequantize_blocks(p) for p in parts])
    assert torch.equal(lin.dequantized(), w * in_scale[None, :] * out_scale[:, None])
    for b in (1, 3, 8, 9, 33):  # 9, 33: the block parts through block_gemm.h (scale, bias, residual as y lands)
        x = torch.randn(b, 512, generator=g)
        ref = (F.linear((x * in_scale).double(), w.double()) * out_scale.double() + bias.double()).float()
        atol = tol(x * in_scale, w) * float(out_scale.max()) + 1e-6
        torch.testing.assert_close(lin(x), ref, rtol=0, atol=atol)
        torch.testing.assert_close(lin.residual(ref, x), ref + ref, rtol=0, atol=2 * atol)


@pytest.mark.parametrize("rows", [2, 30, 70])
def test_kernel_linear_splits_parts_over_threads(kernels, rows: int) -> None:
    """A matrix of parts big enough to be split between threads gives the same rows as one thread, and each
    part alone the same bits: 2 rows through the GEMV, 30 through block_gemm.h (chunks of rows, 6- or 12-row groups),
    70 with its Strassen-Winograd level (pairs of 12-row groups on AVX-512, of 6-row groups elsewhere)."""
    parts = tuple(llama_cpp_blocks(t, 301, 512, i) for i, t in enumerate(("Q4_K", "Q6_K", "Q8_0")))
    lin = ops.block_linear(kernels, parts)
    x = torch.randn(rows, 512)
    one, two = on_one_and_two_threads(lambda: lin.forward(x))
    assert torch.equal(one, two)
    alone = torch.cat([ops.linear_blocks(kernels, x, p) for p in parts], dim=1)
    assert torch.equal(one, alone)  # each part's rows: the same kernel, the same sums


def cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_inner_loops_are_the_machines_best(kernels) -> None:
    """-march=native picks AVX-512 / AVX2 where the CPU has them; SCRATCHLM_KERNELS_PORTABLE=1 the portable loop."""
    flags = cpu_flags()
    if os.environ.get("SCRATCHLM_KERNELS_PORTABLE", "0") == "1":
        want = "portable"
    elif {"avx512f", "avx512bw"} <= flags:
        want = "avx512"
    elif {"avx2", "fma", "f16c"} <= flags:
        want = "avx2"
    else:
        want = "portable"
    if not flags and want == "portable":
        pytest.skip("no /proc/cpuinfo: the CPU's features are unknown")
    assert kernels.simd() == want
