"""Our ggml dequantization against gguf-py's (`gguf.quants.dequantize`), bit for bit, on random blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scratchlm.quant.dequantize import dequantize
from scratchlm.quant.ggml_types import GGML, ggml_type

# byte offsets of the f16 scale fields in one block (random bytes there could be NaN/inf)
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """(rows, row_bytes) uint8: random quant bytes with finite f16 scales, or random finite floats."""
    rng = np.random.default_rng(seed)
    t = ggml_type(type_name)
    if type_name == "F32":
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if type_name == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if type_name == "BF16":
        return (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    data = rng.integers(0, 256, (rows, cols // t.block_size, t.type_size), dtype=np.uint8)
    for off in F16_FIELDS[type_name]:
        scales = (rng.standard_normal((rows, cols // t.block_size)) * 0.05).astype(np.float16)
        data[:, :, off:off + 2] = scales.view(np.uint8).reshape(rows, -1, 2)
    return data.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(GGML))
def test_dequantize_bit_exact_with_gguf_py(type_name):
    rows, cols = 7, 512
    raw = random_blocks(type_name, rows, cols)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    got = dequantize(torch.from_numpy(raw), type_name, (rows, cols))
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert torch.equal(got.view(torch.int32), torch.from_numpy(np.ascontiguousarray(want, np.float32)).view(torch.int32))


def test_type_table_matches_gguf():
    for t in GGML.values():
        q = gguf.GGMLQuantizationType[t.name]
        assert q.value == t.type_id
        assert gguf.GGML_QUANT_SIZES[q] == (t.block_size, t.type_size)


def test_rows_are_independent():
    """Permuting rows of the blocks permutes rows of the values (what GGMLBlocks relies on)."""
    raw = torch.from_numpy(random_blocks("Q4_K", 6, 256, seed=3))
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    assert torch.equal(dequantize(raw[perm].contiguous(), "Q4_K", (6, 256)), dequantize(raw, "Q4_K", (6, 256))[perm])


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="Q5_0"):
        dequantize(torch.zeros(22, dtype=torch.uint8), "Q5_0", (32,))
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize(torch.zeros(144, dtype=torch.uint8), "Q4_K", (1, 128))
    with pytest.raises(ValueError, match="needs 288 uint8 bytes, got 144"):
        dequantize(torch.zeros(144, dtype=torch.uint8), "Q4_K", (2, 256))
