"""One batch row of Q4_K and Q4_0 from the copy repacked 16 rows at a time (gemv_r16.h; AVX512-VNNI builds).

The copy is made by `ops.repacked` and read through the kernels' `Linear`; the reference is float64 on the
dequantized matrix (quant/dequantize.py) with x rounded as test_fixed24.py's torch model does (x~ = X 2^-k):
- the result equals float64 x~ @ W^T within the fp32 summation bound, for whole matrices, matrices cut into
  several threads' chunks and parts of a stacked matrix (Q4_K beside Q6_K, a Q4_K part of 13 rows: no copy; Q4_0
  beside Q4_0 without a copy);
- the copy is taken (the result differs from the in-place kernel's, another summation order) and is shared;
- prompts (several batch rows) still read the file's blocks: the same values as without a copy;
- copies are made by default where the kernel is built and not with SCRATCHLM_REPACK=0; a copy of the wrong
  size is refused.
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.kernels import ops
from scratchlm.kernels.build import native
from scratchlm.model_stats import repacked_memory
from scratchlm.nn.block_linear import BlockLinear
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import dequantize_blocks
from tests.kernels.test_block_types import llama_cpp_blocks, random_blocks, tol
from tests.kernels.test_fixed24 import FIXED_MAX, activations, rounded


@pytest.fixture()
def kernels(monkeypatch):
    mod = native()
    if mod is None or not mod.has_fixed24():
        pytest.skip("gemv_r16.h needs the compiled kernels on an AVX512-VNNI CPU")
    monkeypatch.setenv(ops.REPACK_ENV, "1")
    return mod


def test_copy_by_default_and_switched_off(monkeypatch) -> None:
    blocks = llama_cpp_blocks("Q4_K", 16, 256, seed=0)
    monkeypatch.delenv(ops.REPACK_ENV, raising=False)
    mod = native()
    made = ops.repacked(mod, blocks) is not None
    assert made == (mod is not None and bool(mod.has_fixed24()))  # on by default where the kernel is built
    assert ops.repacked_bytes(mod, blocks) == (2368 if made else 0)  # 16 rows x one super-block: 16 x 148 bytes
    layers = torch.nn.ModuleList([BlockLinear(llama_cpp_blocks("Q4_K", 32, 512, seed=2)),
                                  BlockLinear(llama_cpp_blocks("Q6_K", 32, 512, seed=2)),
                                  BlockLinear(llama_cpp_blocks("Q4_0", 32, 512, seed=2))])
    # Q4_K: 2 groups x 2 super-blocks x 2368; Q4_0: its own 32 x 16 blocks x 18 bytes
    assert repacked_memory(layers) == (4 * 2368 + 32 * 16 * 18 if made else 0)
    monkeypatch.setenv(ops.REPACK_ENV, "0")
    assert ops.repacked(mod, llama_cpp_blocks("Q4_K", 16, 256, seed=1)) is None
    assert ops.repacked_bytes(mod, blocks) == 0 and repacked_memory(layers) == 0


def check_one_row(lin, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """lin's one-row result for x, asserted against float64 (x rounded, then also unrounded)."""
    got = lin.forward(x[None])[0].double()
    xr, amax = rounded(x)
    assert float((got - w @ xr).abs().max()) <= tol(xr[None].float(), w.float())
    bound = float((w.abs() @ amax).max()) / FIXED_MAX + tol(x[None], w.float())
    assert float((got - w @ x.double()).abs().max()) <= bound
    return got


@pytest.mark.parametrize("source", ["random", "llama.cpp"])
@pytest.mark.parametrize("type_name", ["Q4_K", "Q4_0"])
def test_repacked_equals_rounded_x_in_float64(kernels, type_name: str, source: str) -> None:
    maker = random_blocks if source == "random" else llama_cpp_blocks
    for n, k in [(16, 256), (48, 512), (1024, 2048)]:  # one group; 3 groups; threads' chunks
        blocks = maker(type_name, n, k, seed=7)
        assert ops.repacked(kernels, blocks) is not None
        w = dequantize_blocks(blocks).double()
        lin = ops.block_linear(kernels, [blocks])
        for x in activations(k, seed=n):
            check_one_row(lin, w, x)


def test_repacked_parts_and_route(kernels, monkeypatch) -> None:
    parts = [llama_cpp_blocks("Q4_K", 32, 512, seed=1), llama_cpp_blocks("Q6_K", 16, 512, seed=2),
             llama_cpp_blocks("Q4_K", 13, 512, seed=3)]
    assert [ops.repacked(kernels, p) is not None for p in parts] == [True, False, False]
    assert ops.repacked(kernels, parts[0]) is ops.repacked(kernels, parts[0])  # made once, shared
    w = torch.cat([dequantize_blocks(p).double() for p in parts])
    bias = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(0))
    lin = ops.block_linear(kernels, parts, bias=bias)
    x = torch.randn(512, generator=torch.Generator().manual_seed(9))
    got = lin.forward(x[None])[0].double() - bias.double()
    xr, _ = rounded(x)
    assert float((got - w @ xr).abs().max()) <= tol(xr[None].float(), w.float()) + 1e-6 * float(bias.abs().max())
    monkeypatch.setenv(ops.REPACK_ENV, "0")
    assert ops.repacked(kernels, parts[0]) is None
    plain = ops.block_linear(kernels, parts, bias=bias)
    one = lin.forward(x[None])
    assert not torch.equal(one[0, :32], plain.forward(x[None])[0, :32])  # the copy is what one row read
    assert torch.equal(one[0, 32:], plain.forward(x[None])[0, 32:])  # the parts without a copy: the same kernels
    for b in (3, 20):  # prompts read the file's blocks (gemv.h's passes; the GEMM past 8 rows) with or without it
        xs = torch.randn(b, 512, generator=torch.Generator().manual_seed(b))
        assert torch.equal(lin.forward(xs), plain.forward(xs))


def test_repacked_q4_0_parts(kernels, monkeypatch) -> None:
    # a Q4_0 part with a copy beside one without (13 rows): the latter prepares gemv_fixed24_b32.h's x, the former
    # gemv_fixed24.h's, both in one call
    parts = [llama_cpp_blocks("Q4_0", 32, 512, seed=5), llama_cpp_blocks("Q4_0", 13, 512, seed=6)]
    assert [ops.repacked(kernels, p) is not None for p in parts] == [True, False]
    w = torch.cat([dequantize_blocks(p).double() for p in parts])
    lin = ops.block_linear(kernels, parts)
    x = torch.randn(512, generator=torch.Generator().manual_seed(11))
    got = check_one_row(lin, w, x)
    monkeypatch.setenv(ops.REPACK_ENV, "0")
    plain = ops.block_linear(kernels, parts).forward(x[None])[0].double()
    assert not torch.equal(got[:32], plain[:32]) and torch.equal(got[32:], plain[32:])


def test_repacked_switch_and_checks(kernels) -> None:
    blocks = llama_cpp_blocks("Q4_K", 32, 512, seed=4)
    w = dequantize_blocks(blocks).double()
    lin = ops.block_linear(kernels, [blocks])
    x = torch.randn(512, generator=torch.Generator().manual_seed(5))
    before = kernels.set_fixed24(False)  # one row through the fp32 kernels on the file's blocks instead
    try:
        off = lin.forward(x[None])[0].double()
    finally:
        kernels.set_fixed24(before)
    assert float((off - x.double() @ w.T).abs().max()) <= tol(x[None], w.float())
    with pytest.raises(RuntimeError, match="repacked copy must be"):
        kernels.Linear([ops.FORMAT_CODES["Q4_K"]], [blocks.data], [32], 512, None, None, None,
                       [torch.zeros(100, dtype=torch.uint8)])
    q6 = llama_cpp_blocks("Q6_K", 32, 512, seed=4)
    with pytest.raises(RuntimeError, match="for a Q4_K / Q4_0 part"):
        kernels.Linear([ops.FORMAT_CODES["Q6_K"]], [q6.data], [32], 512, None, None, None,
                       [ops.repacked(kernels, blocks)])
    with pytest.raises(RuntimeError, match="N a multiple of 16"):
        kernels.repack_r16(GGMLBlocks("Q4_K", blocks.data[:13].contiguous(), (13, 512)).data, 13, 512,
                           ops.FORMAT_CODES["Q4_K"])
