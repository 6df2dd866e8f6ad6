"""Q4_K, Q4_0, Q2_K and Q3_K from the copy repacked 16 rows at a time (gemv_r16.h, r16_layout.h, weight_rows.h;
AVX512-VNNI builds).

The copy is made by `ops.repacked` and then replaces the blocks: read through the kernels' `Linear`, `linear_blocks`
and `dequantize`; the reference is float64 on the dequantized matrix (quant/dequantize.py) with x rounded as
test_fixed24.py's torch model does (x~ = X 2^-k):
- up to 64 batch rows (gemv_r16.h): every row equals float64 x~ @ W^T within the fp32 summation bound, for whole
  matrices, matrices cut into several threads' chunks and parts of a stacked matrix (Q4_K beside Q6_K, a Q4_K
  part of 13 rows: no copy; Q4_0 beside Q4_0 without a copy);
- the copy is taken (the result differs from the in-place kernel's, another summation order) and is shared;
- past 64 rows (and with set_fixed24(False)) the prompt GEMM widens the copy: the same values as widening the file's
  blocks, so the same result bit for bit; `dequantize` of the copy equals quant/dequantize.py's bit for bit;
- copies are made by default where the kernel is built and not with SCRATCHLM_REPACK=0; a copy of the wrong
  size is refused; the file's pages under a copied matrix leave the process (release_file_pages), memory of the
  process's own is never dropped.
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
    # Q4_K: 2 groups x 2 super-blocks x 2368; Q4_0: its own 32 x 16 blocks x 18 bytes; Q6_K: none
    assert repacked_memory(layers) == (4 * 2368 + 32 * 16 * 18 if made else 0)
    low = torch.nn.ModuleList([BlockLinear(llama_cpp_blocks("Q2_K", 32, 512, seed=2)),
                               BlockLinear(llama_cpp_blocks("Q3_K", 32, 512, seed=2))])
    assert repacked_memory(low) == (4 * 1344 + 4 * 1824 if made else 0)  # Q2_K 16 x 84; Q3_K 16 x 110 + 64
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
@pytest.mark.parametrize("type_name", ["Q4_K", "Q4_0", "Q2_K", "Q3_K"])
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
    for b in (3, 20, 64):  # short batches read the copy too: each row within the bound of its rounded x
        xs = torch.randn(b, 512, generator=torch.Generator().manual_seed(b))
        got = lin.forward(xs).double() - bias.double()
        assert not torch.equal(lin.forward(xs)[:, :32], plain.forward(xs)[:, :32])
        for row in range(b):
            xr, _ = rounded(xs[row])
            err = float((got[row] - w @ xr).abs().max())
            assert err <= tol(xr[None].float(), w.float()) + 1e-6 * float(bias.abs().max())
    xs = torch.randn(100, 512, generator=torch.Generator().manual_seed(100))  # past 64: the GEMM widens the copy,
    assert torch.equal(lin.forward(xs), plain.forward(xs))  # the same values as the blocks': the same sums


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
    xs = torch.randn(3, 512, generator=torch.Generator().manual_seed(6))
    before = kernels.set_fixed24(False)  # the fp32 GEMM on the widened copy instead, any number of rows
    try:
        off = lin.forward(x[None])[0].double()
        off3 = lin.forward(xs).double()
    finally:
        kernels.set_fixed24(before)
    assert float((off - x.double() @ w.T).abs().max()) <= tol(x[None], w.float())
    assert float((off3 - xs.double() @ w.T).abs().max()) <= tol(xs, w.float())
    with pytest.raises(RuntimeError, match="repacked copy must be"):
        kernels.Linear([ops.FORMAT_CODES["Q4_K"]], [blocks.data], [32], 512, None, None, None,
                       [torch.zeros(100, dtype=torch.uint8)])
    q6 = llama_cpp_blocks("Q6_K", 32, 512, seed=4)
    with pytest.raises(RuntimeError, match="for a Q4_K / Q4_0 / Q2_K / Q3_K part"):
        kernels.Linear([ops.FORMAT_CODES["Q6_K"]], [q6.data], [32], 512, None, None, None,
                       [ops.repacked(kernels, blocks)])
    with pytest.raises(RuntimeError, match="N a multiple of 16"):
        kernels.repack_r16(GGMLBlocks("Q4_K", blocks.data[:13].contiguous(), (13, 512)).data, 13, 512,
                           ops.FORMAT_CODES["Q4_K"])


@pytest.mark.parametrize("source", ["random", "llama.cpp"])
@pytest.mark.parametrize("type_name", ["Q4_K", "Q4_0", "Q2_K", "Q3_K"])
def test_copy_widens_to_the_dequantized_values(kernels, type_name: str, source: str) -> None:
    maker = random_blocks if source == "random" else llama_cpp_blocks
    blocks = maker(type_name, 48, 768, seed=3)
    ref = dequantize_blocks(blocks)  # quant/dequantize.py
    copy = kernels.repack_r16(blocks.data, 48, 768, ops.FORMAT_CODES[type_name])
    got = kernels.dequantize(torch.zeros_like(blocks.data), 48, 768, ops.FORMAT_CODES[type_name], None, copy)
    assert torch.equal(got, ref)  # the copy alone (the blocks given are zeros) widens to the same values
    x = torch.randn(70, 768, generator=torch.Generator().manual_seed(1))  # 70 rows: the GEMM, widening the copy
    from_copy = kernels.linear_blocks(x, torch.zeros_like(blocks.data), 48, 768, ops.FORMAT_CODES[type_name], copy)
    assert torch.equal(from_copy, kernels.linear_blocks(x, blocks.data, 48, 768, ops.FORMAT_CODES[type_name]))


def test_copy_made_once_across_threads(kernels) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import threading

    blocks = random_blocks("Q4_K", 4096, 2048, seed=12)  # a repack long enough (the GIL released) to overlap
    start = threading.Barrier(4)

    def build(_: int) -> torch.Tensor:
        start.wait()  # decoders built on several threads at once
        return ops.repacked(kernels, blocks)

    with ThreadPoolExecutor(4) as pool:
        copies = list(pool.map(build, range(4)))
    assert all(c is copies[0] for c in copies)  # one copy, shared


def resident_kb(t: torch.Tensor) -> int:
    """Resident kB of the mapping that holds t's first byte (/proc/self/smaps)."""
    addr = t.data_ptr()
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("no mapping holds the tensor")


def test_file_pages_released_after_copy(kernels, tmp_path) -> None:
    import mmap

    import numpy as np

    blocks = llama_cpp_blocks("Q4_K", 512, 2048, seed=8)  # 576 KB of blocks
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 4096 + blocks.data.numpy().tobytes())
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # as the GGUF reader maps a file
    mapped = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8)[4096:].reshape(blocks.data.shape))
    in_file = GGMLBlocks("Q4_K", mapped, blocks.shape)
    assert int(mapped.sum()) == int(blocks.data.sum()) and resident_kb(mapped) >= 500
    assert ops.repacked(kernels, in_file) is not None
    assert resident_kb(mapped) <= 8  # the copy replaced the file's pages
    x = torch.randn(3, 2048, generator=torch.Generator().manual_seed(2))
    assert ops.repacked(kernels, blocks) is not None  # the process's own memory: copied, not dropped
    assert torch.equal(ops.linear_blocks(kernels, x, in_file), ops.linear_blocks(kernels, x, blocks))  # the copies
    assert resident_kb(mapped) <= 8  # read the copy, not the file
    assert torch.equal(mapped, blocks.data)  # the file's bytes come back if something reads them
    own = blocks.data.clone()  # the process's own memory: never dropped
    assert kernels.release_file_pages(own) == 0 and torch.equal(own, blocks.data)


def test_expert_tensor_repacked_once_and_sliced_per_expert(kernels) -> None:
    """A GGUF expert tensor (E matrices stacked by rows, cut per expert by expert_blocks) is repacked once
    (ops.repack_stack) and each expert reads its slice: the slice holds the bytes of that expert's own copy
    (repack_r16 of its rows alone, itself tested against quant/dequantize.py above) and the expert's product equals
    that of the same rows with their own copy, bit for bit; experts not consecutive in one tensor get no stacked
    view."""
    from scratchlm.nn.block_experts import BlockExperts, expert_blocks

    e, f, k = 3, 32, 512
    stacked = llama_cpp_blocks("Q4_K", e * f, k, seed=11)
    parts = [expert_blocks("Q4_K", stacked.data, (e, f, k)) for _ in range(3)]  # gate, up, down (same bytes: enough)
    ex = BlockExperts(*parts)
    whole = ex.stacked("gate_proj")
    assert whole is not None and whole.data.data_ptr() == stacked.data.data_ptr() and whole.shape == (e * f, k)
    gates = [lin.blocks for lin in ex.gate_proj]
    ops.repack_stack(kernels, whole, gates)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(4))
    for i, g in enumerate(gates):
        own = kernels.repack_r16(g.data.clone(), f, k, ops.FORMAT_CODES["Q4_K"])
        got = ops.repacked(kernels, g)
        assert got is not None and torch.equal(got, own)
        alone = GGMLBlocks("Q4_K", g.data.clone(), g.shape)
        assert ops.repacked(kernels, alone) is not None  # its own copy
        assert torch.equal(ops.linear_blocks(kernels, x, g), ops.linear_blocks(kernels, x, alone))
    apart = [GGMLBlocks("Q4_K", b.data.clone(), b.shape) for b in gates]  # each expert in its own memory
    assert BlockExperts(apart, apart, apart).stacked("gate_proj") is None
