"""Blocks written by llama.cpp's own quantizer (`ggml_quantize_chunk` in libggml-base.so, what
`llama_model_quantize` runs per tensor): our dequantization equals gguf-py's and ggml's C `dequantize_row_*`
bit for bit, with and without an importance matrix (the quantizer takes a different path with one)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from ggml_c_lib import dequantize as c_dequantize
from ggml_c_lib import quantize as c_quantize
from ggml_c_lib import requires_imatrix

from scratchlm.quant.dequantize import dequantize
from scratchlm.quant.ggml_types import GGML, FLOAT_TYPES

# bound on the relative RMS error of llama.cpp's round trip on the rows below (except the 1e-5 row): proves
# the bytes are a real quantization of the input. About 1.4x the largest error measured over 8 seeds, with and
# without an imatrix (Q2_K 0.45, Q3_K 0.21, Q4_0 0.16, IQ4_XS 0.13, Q5_0 0.08, Q6_K 0.03, Q8_0 0.011).
MAX_REL_RMS = {"Q2_K": 0.6, "Q3_K": 0.3, "Q4_0": 0.22, "Q4_1": 0.16, "IQ4_NL": 0.2, "IQ4_XS": 0.2,
               "Q4_K": 0.2, "Q5_0": 0.12, "Q5_1": 0.08, "Q5_K": 0.08, "Q6_K": 0.045, "Q8_0": 0.016}
TINY_ROW = 4  # scaled by 1e-5: f16 scales underflow (subnormal or 0); only bit-exactness is checked there
BLOCK_TYPES = sorted(set(GGML) - set(FLOAT_TYPES))


def rows_for(type_name: str, seed: int) -> np.ndarray:
    """Gaussian rows with a few outliers; 576 wide (SmolLM2's width) for the 32-value types, 768 for the others."""
    rng = np.random.default_rng(seed)
    cols = 576 if GGML[type_name].block_size == 32 else 768
    x = rng.standard_normal((6, cols)).astype(np.float32)
    x[rng.random(x.shape) < 0.01] *= 8
    x[3] *= 1e-3  # small rows: f16 scales near f16's smallest normal (6.1e-5), some below
    x[TINY_ROW] *= 1e-5
    return x


def test_table_covers_every_block_type():
    assert set(MAX_REL_RMS) == set(BLOCK_TYPES)


@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_llama_cpp_blocks_bit_exact(type_name, with_imatrix):
    assert not requires_imatrix(type_name)  # llama.cpp quantizes every supported type without one
    x = rows_for(type_name, seed=len(type_name) + 10 * with_imatrix)
    rng = np.random.default_rng(7)
    imatrix = (rng.random(x.shape[1]) * 4 + 0.1).astype(np.float32) if with_imatrix else None
    raw = c_quantize(x, type_name, imatrix)
    got = dequantize(torch.from_numpy(raw), type_name, x.shape)
    want = np.ascontiguousarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]), np.float32)
    assert torch.equal(got.view(torch.int32), torch.from_numpy(want).view(torch.int32))
    assert torch.equal(got.view(torch.int32), torch.from_numpy(c_dequantize(raw, type_name)).view(torch.int32))
    for r in sorted(set(range(x.shape[0])) - {TINY_ROW}):  # the blocks hold x, each row to its type's precision
        err = np.sqrt(np.mean((got[r].numpy() - x[r]) ** 2) / np.mean(x[r] ** 2))
        assert err < MAX_REL_RMS[type_name], (r, err)


def test_imatrix_changes_the_blocks():
    """The importance-matrix path is really taken (else the imatrix cases above would test nothing new)."""
    for type_name in ("Q5_0", "IQ4_NL", "Q2_K", "Q3_K", "IQ4_XS"):
        x = rows_for(type_name, seed=0)
        w = np.linspace(0.1, 4, x.shape[1], dtype=np.float32)
        assert not np.array_equal(c_quantize(x, type_name), c_quantize(x, type_name, w)), type_name
