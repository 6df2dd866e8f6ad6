"""Matrix products on ggml blocks (quant/block_matmul.py) and the modules built on them
(nn/block_linear.py, nn/block_embedding.py) against torch on the dequantized weights.

Blocks are written by llama.cpp's own quantizer (ggml_quantize_chunk through ctypes, ggml_c_lib.py);
the reference is torch's F.linear / F.embedding / autograd on gguf-py's dequantization of the same bytes.
fp32 tolerances: the tiled product sums the same K terms per output in torch's GEMM, rtol 1e-5."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn.block_embedding import BlockEmbedding
from scratchlm.nn.block_linear import BlockLinear
from scratchlm.quant import block_matmul
from scratchlm.quant.blocks import GGMLBlocks

from ggml_c_lib import quantize

TYPES = ["Q4_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16"]


def llama_cpp_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> tuple[GGMLBlocks, torch.Tensor]:
    """(blocks written by llama.cpp, their values dequantized by gguf-py as fp32 (rows, cols))."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = x.astype(np.float16).view(np.uint8) if type_name == "F16" else quantize(x, type_name)
    raw = raw.reshape(rows, -1)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(rows, cols)
    return GGMLBlocks(type_name, torch.from_numpy(raw.copy()), (rows, cols)), torch.from_numpy(ref.astype(np.float32))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to fp32 summation-order noise: |a - b| <= 1e-5 * max |b| (+ rtol 1e-5)."""
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("type_name", TYPES)
def test_tiled_product_equals_linear_on_dequantized(type_name, monkeypatch):
    blocks, w = llama_cpp_blocks(type_name, 48, 512)
    x = torch.randn(3, 5, 512)
    want = F.linear(x, w)
    assert close(block_matmul.matmul_t(x, blocks), want)
    monkeypatch.setattr(block_matmul, "TILE_BYTES", 512 * 4 * 7)  # 7 rows per tile: 7 tiles, the last short
    assert block_matmul.tile_rows(blocks) == 7
    assert close(block_matmul.matmul_t(x, blocks), want)
    g = torch.randn(3, 5, 48)
    assert close(block_matmul.matmul(g, blocks), g @ w)


def test_gradient_reaches_x_and_bias_only(monkeypatch):
    monkeypatch.setattr(block_matmul, "TILE_BYTES", 256 * 4 * 5)
    blocks, w = llama_cpp_blocks("Q4_K", 16, 256)
    b = torch.randn(16, requires_grad=True)
    x = torch.randn(4, 256, requires_grad=True)
    block_matmul.block_linear(x, blocks, b).square().sum().backward()
    x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    F.linear(x2, w, b2).square().sum().backward()
    assert close(x.grad, x2.grad)
    assert close(b.grad, b2.grad)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "Q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 20, 40])
def test_block_linear_equals_linear(type_name, rows):
    """Few rows run the C++ kernel where it reads the type, more rows the tiled product: both equal
    F.linear on the dequantized matrix (the kernel to fp32 summation order)."""
    blocks, w = llama_cpp_blocks(type_name, 64, 256, seed=1)
    bias = torch.randn(64)
    lin = BlockLinear(blocks, bias.clone())
    x = torch.randn(rows, 256)
    assert close(lin(x), F.linear(x, w, bias))
    assert torch.equal(lin.weight, w) and lin.out_features == 64 and lin.in_features == 256
    assert [n for n, _ in lin.named_parameters()] == ["bias"]  # W is data, not a parameter


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_0"])
def test_tiles_widened_into_the_reused_scratch_equal_linear(type_name, monkeypatch):
    """More rows than the kernel takes: the C++ widening writes every tile into one per-thread scratch buffer;
    products of two matrices in turn, several tiles each, forward and the input gradient, equal F.linear."""
    monkeypatch.setattr(block_matmul, "TILE_BYTES", 256 * 4 * 7)  # 7 rows per tile
    monkeypatch.setattr(block_matmul._SCRATCH, "tile", None, raising=False)
    (b1, w1), (b2, w2) = llama_cpp_blocks(type_name, 48, 256, seed=3), llama_cpp_blocks(type_name, 40, 256, seed=4)
    l1, l2 = BlockLinear(b1), BlockLinear(b2)
    x = torch.randn(2, 30, 256, requires_grad=True)
    y = l2(l1(x)[..., :32].repeat(1, 1, 8))  # (2, 30, 40): the second product overwrites the first's tiles
    x2 = x.detach().clone().requires_grad_()
    want = F.linear(F.linear(x2, w1)[..., :32].repeat(1, 1, 8), w2)
    assert close(y, want)
    y.square().sum().backward()
    want.square().sum().backward()
    assert close(x.grad, x2.grad)


def test_block_embedding_equals_embedding():
    blocks, w = llama_cpp_blocks("Q6_K", 40, 256, seed=2)
    emb = BlockEmbedding(blocks)
    ids = torch.tensor([[0, 39, 7], [7, 7, 1]])
    assert torch.equal(emb(ids), F.embedding(ids, w))
    with pytest.raises(ValueError, match="id 40 >= vocab_size 40"):
        emb(torch.tensor([40]))
