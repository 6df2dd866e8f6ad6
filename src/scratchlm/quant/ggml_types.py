"""The ggml tensor types scratchlm reads and writes: ids, block sizes and bytes per block.

A ggml row of `cols` values is stored as cols / block_size blocks of type_size bytes each:

    type   id  block  bytes  layout of one block (little endian; "f16" = IEEE half)
    F32     0      1      4  the value
    F16     1      1      2  the value as f16
    Q4_0    2     32     18  d:f16, qs[16] (4-bit q_j in low nibbles for j < 16, high for j >= 16); x = d (q - 8)
    Q4_1    3     32     20  d:f16, m:f16, qs[16];                                          x = d q + m
    Q8_0    8     32     34  d:f16, qs:int8[32];                                            x = d q
    Q4_K   12    256    144  d, dmin:f16, scales[12] (8 six-bit scales + 8 six-bit mins), qs[128]
    Q5_K   13    256    176  d, dmin:f16, scales[12], qh[32] (the fifth bits), qs[128]
    Q6_K   14    256    210  ql[128], qh[64], scales:int8[16], d:f16
    BF16   30      1      2  the upper 16 bits of the f32 value
(ggml's ggml-common.h defines these structs; the ids are GGUF's `ggml_type` numbers.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type: its GGUF id, values per block and bytes per block."""

    name: str
    type_id: int
    block_size: int
    type_size: int

    def row_bytes(self, cols: int) -> int:
        """Bytes of one row of `cols` values; cols must be a multiple of block_size."""
        if cols % self.block_size:
            raise ValueError(f"a {self.name} row needs a multiple of {self.block_size} values, got {cols}")
        return cols // self.block_size * self.type_size


GGML = {t.name: t for t in (
    GGMLType("F32", 0, 1, 4), GGMLType("F16", 1, 1, 2), GGMLType("Q4_0", 2, 32, 18), GGMLType("Q4_1", 3, 32, 20),
    GGMLType("Q8_0", 8, 32, 34), GGMLType("Q4_K", 12, 256, 144), GGMLType("Q5_K", 13, 256, 176),
    GGMLType("Q6_K", 14, 256, 210), GGMLType("BF16", 30, 1, 2),
)}
GGML_BY_ID = {t.type_id: t for t in GGML.values()}
FLOAT_TYPES = ("F32", "F16", "BF16")


def ggml_type(name_or_id: str | int) -> GGMLType:
    """The GGMLType for a name ("Q4_K") or GGUF id (12); ValueError naming the supported ones otherwise."""
    found = GGML_BY_ID.get(name_or_id) if isinstance(name_or_id, int) else GGML.get(name_or_id)
    if found is None:
        raise ValueError(f"ggml tensor type {name_or_id!r} is not supported by scratchlm; supported: "
                         f"{', '.join(f'{t.name} ({t.type_id})' for t in GGML.values())}")
    return found
