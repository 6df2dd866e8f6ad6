"""Our ggml dequantization against gguf-py's (`gguf.quants.dequantize`) and ggml's own C `dequantize_row_*`,
bit for bit, on random blocks; the type table against gguf-py's and ggml's; unsupported types refused by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from ggml_c_lib import c_type_traits
from ggml_c_lib import dequantize as c_dequantize

from scratchlm.quant.dequantize import dequantize
from scratchlm.quant.ggml_types import GGML, GGML_TYPE_NAMES, REMOVED_TYPE_NAMES, ggml_type

# byte offsets of the f16 scale fields in one block (random bytes there could be NaN/inf)
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "IQ4_NL": (0,),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}
BLOCK_TYPES = sorted(F16_FIELDS)


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


def bits(x) -> torch.Tensor:
    """float32 values as their int32 bit patterns (so -0.0 and 0.0 differ)."""
    x = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x, np.float32))
    return x.contiguous().view(torch.int32)


def test_every_table_type_is_tested():
    assert set(GGML) == set(BLOCK_TYPES) | {"F32", "F16", "BF16"}


@pytest.mark.parametrize("type_name", sorted(GGML))
def test_dequantize_bit_exact_with_gguf_py(type_name):
    rows, cols = 7, 512
    raw = random_blocks(type_name, rows, cols)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    got = dequantize(torch.from_numpy(raw), type_name, (rows, cols))
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_dequantize_bit_exact_with_ggml_c(type_name):
    """The same random blocks through llama.cpp's compiled dequantize_row_<type> (libggml-base.so)."""
    rows, cols = 5, 768
    raw = random_blocks(type_name, rows, cols, seed=1)
    got = dequantize(torch.from_numpy(raw), type_name, (rows, cols))
    assert torch.equal(bits(got), bits(c_dequantize(raw, type_name)))


def test_type_table_matches_gguf_and_ggml():
    for t in GGML.values():
        q = gguf.GGMLQuantizationType[t.name]
        assert q.value == t.type_id
        assert gguf.GGML_QUANT_SIZES[q] == (t.block_size, t.type_size)
        assert c_type_traits(t.type_id) == (t.name.lower().replace("_k", "_K"), t.block_size, t.type_size)
    for q in gguf.GGMLQuantizationType:  # every type gguf-py knows is named by id
        assert GGML_TYPE_NAMES[q.value] == q.name
    for type_id, name in GGML_TYPE_NAMES.items():  # ... and ggml names each type the same way
        assert c_type_traits(type_id)[0].upper() == name
    for type_id in REMOVED_TYPE_NAMES:
        assert c_type_traits(type_id)[1:] == (0, 0)  # ggml: no block size, no bytes


def test_rows_are_independent():
    """Permuting rows of the blocks permutes rows of the values (what GGMLBlocks relies on)."""
    for type_name in ("Q4_K", "Q3_K", "IQ4_XS"):
        raw = torch.from_numpy(random_blocks(type_name, 6, 256, seed=3))
        perm = torch.tensor([5, 0, 3, 1, 4, 2])
        assert torch.equal(dequantize(raw[perm].contiguous(), type_name, (6, 256)),
                           dequantize(raw, type_name, (6, 256))[perm])


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"ggml tensor type 'IQ2_XXS' \(16\) is not supported by scratchlm"):
        dequantize(torch.zeros(66, dtype=torch.uint8), "IQ2_XXS", (256,))
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize(torch.zeros(144, dtype=torch.uint8), "Q4_K", (1, 128))
    with pytest.raises(ValueError, match="needs 288 uint8 bytes, got 144"):
        dequantize(torch.zeros(144, dtype=torch.uint8), "Q4_K", (2, 256))


SUPPORTED = ("supported: F32 (0), F16 (1), Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q8_0 (8), Q2_K (10), Q3_K (11), "
             "Q4_K (12), Q5_K (13), Q6_K (14), IQ4_NL (20), IQ4_XS (23), BF16 (30)")


@pytest.mark.parametrize("type_id", sorted(set(GGML_TYPE_NAMES) - {t.type_id for t in GGML.values()}))
def test_unsupported_types_are_refused_by_name(type_id):
    name = GGML_TYPE_NAMES[type_id]
    for key in (type_id, name):
        with pytest.raises(ValueError) as err:
            ggml_type(key)
        assert str(err.value) == f"ggml tensor type {name!r} ({type_id}) is not supported by scratchlm; {SUPPORTED}"


def test_ids_and_names_that_are_no_ggml_type_say_unknown():
    with pytest.raises(ValueError) as err:
        ggml_type(99)
    assert str(err.value) == f"unknown ggml type id 99; {SUPPORTED}"
    with pytest.raises(ValueError, match=r"^unknown ggml type id 31 \(ggml removed its type Q4_0_4_4\); supported"):
        ggml_type(31)
    with pytest.raises(ValueError, match=r"^unknown ggml type name 'Q4_K_M'; supported: F32 \(0\)"):
        ggml_type("Q4_K_M")  # a file type (llama_ftype), not a tensor type
    assert ggml_type(gguf.GGMLQuantizationType.IQ4_XS) is ggml_type("IQ4_XS") is ggml_type(23)
