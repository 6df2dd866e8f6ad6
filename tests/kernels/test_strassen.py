"""The prompt GEMM's Strassen-Winograd level (kernels/csrc/strassen_gemm.h) against float64 and the plain order.

On every build (AVX-512, AVX2, portable), from 49 tokens (units of four 16-token tiles, a last tile's padding lanes
zero tokens) with K a multiple of 256, pairs of row groups (12 rows each on AVX-512, 6 elsewhere) take one
level of Strassen-Winograd (7 block products for 8). Per block type that reaches it (a 32-value and a 256-value
one of each family):
- == float64 x @ W^T (W = dequantize_blocks) within the fp32 bound of each token on its own (1e-6 * that token's
  max_n sum_k |x_k w_nk| + 1e-7), for 56, 64, 100, 120 and 130 tokens (56, 120: a last unit with padding lanes;
  100, 130: tiles past the units, the plain micro-kernels) and
  85 weight rows (AVX-512: three pairs of 12-row groups and 13 rows past them), with one token 2^20 times the size of the
  others: each token's x is scaled by a power of two to its own range first, so the large token's rounding does not
  reach the sums of its partner (the token 32 places from it in its unit of 64: a zero token's outputs would be
  that partner's rounding, ~1e-7 of its scaled sums, not exact zeros);
- set_strassen(False) gives the plain order, within the same bound, whose rows are the same bits at every batch
  size; the two orders differ (the level ran);
- two threads give the same bits as one (the pairs are the same rows whatever the split);
- a call whose x holds an inf or a NaN runs the plain order, so the other tokens' outputs stay finite (inf - inf in
  the sums would reach a token's partner).
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.kernels import ops
from scratchlm.quant.dequantize import dequantize_blocks
from tests.kernels.test_block_types import llama_cpp_blocks
from tests.kernels.test_linear_kernels import on_one_and_two_threads

TYPES = ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS"]
K = 768  # three chunks of 256
N_ROWS = 3 * 24 + 13


def tokens(b: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, K, generator=g) * (torch.rand(b, 1, generator=g) * 4 + 0.1)
    x[5] *= 2.0**20  # 5 and 37 share a unit's Strassen sums (the halves of 32 tokens)
    return x


def per_token_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(B, 1): 1e-6 * max_n sum_k |x_bk w_nk| + 1e-7, each token's own fp32 summation bound."""
    return 1e-6 * (x.abs().double() @ w.abs().double().T).max(dim=1, keepdim=True).values + 1e-7


def with_strassen(kernels, on: bool, fn):
    before = kernels.set_strassen(on)
    try:
        return fn()
    finally:
        kernels.set_strassen(before)


@pytest.mark.parametrize("type_name", TYPES)
def test_strassen_level_is_within_each_tokens_fp32_bound(kernels, type_name: str) -> None:
    blocks = llama_cpp_blocks(type_name, N_ROWS, K, seed=7)
    w = dequantize_blocks(blocks)
    x = tokens(130)
    for b in (56, 64, 100, 120, 130):
        ref = x[:b].double() @ w.double().T
        bound = per_token_bound(x[:b], w)
        on = with_strassen(kernels, True, lambda: ops.linear_blocks(kernels, x[:b], blocks))
        off = with_strassen(kernels, False, lambda: ops.linear_blocks(kernels, x[:b], blocks))
        for got in (on, off):
            err = (got.double() - ref).abs()
            assert bool((err <= bound).all()), (b, float((err / bound).max()))
        assert not torch.equal(on, off)  # the level ran
    plain = with_strassen(kernels, False, lambda: ops.linear_blocks(kernels, x, blocks))
    for b in (56, 64, 100):
        same = with_strassen(kernels, False, lambda: ops.linear_blocks(kernels, x[:b], blocks))
        assert torch.equal(same, plain[:b])


def test_strassen_level_does_not_depend_on_the_thread_count(kernels) -> None:
    blocks = llama_cpp_blocks("Q4_K", 24 * 40, K, seed=8)  # enough weight rows to be split between threads
    x = tokens(100, seed=1)
    one, two = on_one_and_two_threads(lambda: ops.linear_blocks(kernels, x, blocks))
    assert torch.equal(one, two)


def test_a_non_finite_token_does_not_reach_its_partner(kernels) -> None:
    blocks = llama_cpp_blocks("Q4_K", N_ROWS, K, seed=9)
    for bad in (float("inf"), float("nan")):
        x = tokens(128, seed=2)
        x[5, 17] = bad  # token 5's partner in the unit: 37
        on = with_strassen(kernels, True, lambda: ops.linear_blocks(kernels, x, blocks))
        off = with_strassen(kernels, False, lambda: ops.linear_blocks(kernels, x, blocks))
        rest = torch.ones(128, dtype=torch.bool)
        rest[5] = False
        assert bool(torch.isfinite(on[rest]).all())
        assert torch.equal(on[rest], off[rest])
