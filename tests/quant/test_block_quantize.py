"""ggml Q8_0 / Q4_1 quantization in torch == gguf-py's (ggml's reference rounding), byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from scratchlm.quant.dequantize import dequantize_blocks
from scratchlm.quant.quantize import quantize_blocks, round_half_away




def awkward_matrix() -> torch.Tensor:
    """Random rows of very different scales plus the edge cases: an all-zero block, a constant block,
    values exactly halfway between two quantization levels, a lone outlier."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 128, generator=g) * torch.logspace(-4, 1, 24)[:, None]
    w[0, :32] = 0.0
    w[1, 32:64] = 0.75
    w[2, :32] = torch.arange(32) * 0.5 - 8.0  # Q4_1 levels of step ~0.5: many exact halves
    w[3, :32] = torch.linspace(-127, 127, 32) / 2  # Q8_0: q = x / d hits .5 exactly
    w[4, 100] = 50.0
    return w


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
def test_quantize_matches_gguf_py_bytes(ggml_type: str) -> None:
    w = awkward_matrix()
    ours = quantize_blocks(w, ggml_type)
    ref = quantize(w.numpy(), GGMLQuantizationType[ggml_type])
    assert ours.ggml_type == ggml_type and ours.shape == (24, 128)
    assert np.array_equal(ours.data.numpy(), ref)


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
def test_dequantize_matches_gguf_py_and_error_is_bounded(ggml_type: str) -> None:
    w = awkward_matrix()
    blocks = quantize_blocks(w, ggml_type)
    deq = dequantize_blocks(blocks)
    ref = dequantize(blocks.data.numpy(), GGMLQuantizationType[ggml_type])
    assert np.array_equal(deq.numpy(), ref)
    # error: half a quantization step per block (Q8_0: max|x|/254, Q4_1: (max - min)/30) plus the fp16
    # rounding of d and m (relative 2^-11; blocks whose d is an fp16 subnormal, max|x| < ~1e-2, are excluded)
    x = w.reshape(24, 4, 32)
    step = x.abs().amax(-1) / 127 if ggml_type == "Q8_0" else (x.amax(-1) - x.amin(-1)) / 15
    err = (deq - w).abs().reshape(24, 4, 32).amax(-1)
    normal = x.abs().amax(-1) > 1e-2
    assert bool((err <= step * 0.5 + 2 * 2.0**-11 * x.abs().amax(-1))[normal].all())


def test_round_half_away_is_c_roundf() -> None:
    x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -3.2])
    assert round_half_away(x).tolist() == [-3.0, -2.0, -1.0, 1.0, 2.0, 3.0, 0.0, -3.0]


def test_bad_shapes_and_types_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_blocks(torch.zeros(4, 40), "Q8_0")
    blocks = quantize_blocks(torch.zeros(2, 32), "Q8_0")
    with pytest.raises(ValueError, match="Q4_K"):
        dequantize_blocks(type(blocks)("Q4_K", blocks.data, blocks.shape))
