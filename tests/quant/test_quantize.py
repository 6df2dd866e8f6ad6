"""Our ggml quantizers (GGUF export) against gguf-py's `gguf.quants.quantize`, byte for byte."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scratchlm.quant.dequantize import dequantize
from scratchlm.quant.quantize import quantize


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d = 0, q = 0
    x[1, :32] = np.linspace(-127, 127, 32)
    x[1, :4] = [127.0, 62.5, -62.5, 0.5]  # d = 1: exact halves round away from zero
    x[2] *= 1e-3
    return x


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16", "Q8_0"])
def test_quantize_bytes_equal_gguf_py(type_name):
    x = _values()
    want = gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name])
    got = quantize(torch.from_numpy(x), type_name)
    assert got.dtype == torch.uint8
    assert np.array_equal(got.numpy(), np.ascontiguousarray(want).view(np.uint8).reshape(got.shape))


def test_q8_0_round_trip_error_is_bounded():
    """|x - d16 q| <= d/2 (rounding) + 127 |d - d16| (d stored as f16, relative error <= 2^-11)."""
    x = torch.from_numpy(_values())
    back = dequantize(quantize(x, "Q8_0"), "Q8_0", tuple(x.shape))
    step = x.reshape(-1, 32).abs().amax(1, keepdim=True) / 127
    assert ((back - x).reshape(-1, 32).abs() <= step * (0.5 + 127 * 2.0 ** -11)).all()


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(torch.zeros(2, 48), "Q8_0")
    with pytest.raises(ValueError, match="Q4_K is not implemented"):
        quantize(torch.zeros(2, 256), "Q4_K")
