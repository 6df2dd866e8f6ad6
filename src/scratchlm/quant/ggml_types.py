"""The ggml tensor types scratchlm reads and writes: ids, block sizes and bytes per block.

A ggml row of `cols` values is stored as cols / block_size blocks of type_size bytes each:

    type    id  block  bytes  layout of one block (little endian; "f16" = IEEE half)
    F32      0      1      4  the value
    F16      1      1      2  the value as f16
    Q4_0     2     32     18  d:f16, qs[16] (4-bit q_j in low nibbles for j < 16, high for j >= 16); x = d (q - 8)
    Q4_1     3     32     20  d:f16, m:f16, qs[16];                                          x = d q + m
    Q5_0     6     32     22  d:f16, qh:u32 (bit j = fifth bit of q_j), qs[16] as Q4_0;      x = d (q - 16)
    Q5_1     7     32     24  d:f16, m:f16, qh:u32, qs[16];                                  x = d q + m
    Q8_0     8     32     34  d:f16, qs:int8[32];                                            x = d q
    Q2_K    10    256     84  scales[16] (4-bit scale | 4-bit min << 4), qs[64] (2-bit q), d, dmin:f16
    Q3_K    11    256    110  hmask[32] (the third bits), qs[64] (2 low bits), scales[12] (16 six-bit), d:f16
    Q4_K    12    256    144  d, dmin:f16, scales[12] (8 six-bit scales + 8 six-bit mins), qs[128]
    Q5_K    13    256    176  d, dmin:f16, scales[12], qh[32] (the fifth bits), qs[128]
    Q6_K    14    256    210  ql[128], qh[64], scales:int8[16], d:f16
    IQ4_NL  20     32     18  d:f16, qs[16] (4-bit indices into the table kvalues_iq4nl, as Q4_0)
    IQ4_XS  23    256    136  d:f16, scales_h:u16, scales_l[4] (8 six-bit scales), qs[128] (4-bit indices)
    BF16    30      1      2  the upper 16 bits of the f32 value
(ggml's ggml-common.h defines these structs; the ids are GGUF's `ggml_type` numbers.)

Every other ggml type is known by name (GGML_TYPE_NAMES, ids from ggml.h's `enum ggml_type`) so that a
file holding one is refused by name; ids ggml itself removed (REMOVED_TYPE_NAMES) and ids that were never
a ggml type are refused as unknown.
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
    GGMLType("Q5_0", 6, 32, 22), GGMLType("Q5_1", 7, 32, 24), GGMLType("Q8_0", 8, 32, 34),
    GGMLType("Q2_K", 10, 256, 84), GGMLType("Q3_K", 11, 256, 110), GGMLType("Q4_K", 12, 256, 144),
    GGMLType("Q5_K", 13, 256, 176), GGMLType("Q6_K", 14, 256, 210), GGMLType("IQ4_NL", 20, 32, 18),
    GGMLType("IQ4_XS", 23, 256, 136), GGMLType("BF16", 30, 1, 2),
)}
GGML_BY_ID = {t.type_id: t for t in GGML.values()}
FLOAT_TYPES = ("F32", "F16", "BF16")

# every ggml type by id, the supported ones and those scratchlm refuses (ggml.h, `enum ggml_type`)
GGML_TYPE_NAMES = {
    **{t.type_id: t.name for t in GGML.values()},
    9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 21: "IQ3_S", 22: "IQ2_S",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
    40: "NVFP4", 41: "Q1_0", 42: "Q2_0",
}
GGML_TYPE_IDS = {name: type_id for type_id, name in GGML_TYPE_NAMES.items()}
# ids whose types ggml removed (ggml.h keeps them as comments; no current file holds them)
REMOVED_TYPE_NAMES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
                      36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}


def _supported() -> str:
    return "supported: " + ", ".join(f"{t.name} ({t.type_id})" for t in GGML.values())


def ggml_type(name_or_id: str | int) -> GGMLType:
    """The GGMLType for a name ("Q4_K") or GGUF id (12).

    ValueError otherwise, one line naming the type and listing the supported ones: a ggml type scratchlm
    does not read ("ggml tensor type 'IQ2_XXS' (16) is not supported ..."), or a name / id that is no
    current ggml type ("unknown ggml type id 99 ...").
    """
    if isinstance(name_or_id, int):
        type_id = int(name_or_id)
        if type_id in GGML_BY_ID:
            return GGML_BY_ID[type_id]
        if type_id in GGML_TYPE_NAMES:
            raise ValueError(f"ggml tensor type {GGML_TYPE_NAMES[type_id]!r} ({type_id}) is not supported by "
                             f"scratchlm; {_supported()}")
        removed = f" (ggml removed its type {REMOVED_TYPE_NAMES[type_id]})" if type_id in REMOVED_TYPE_NAMES else ""
        raise ValueError(f"unknown ggml type id {type_id}{removed}; {_supported()}")
    if name_or_id in GGML:
        return GGML[name_or_id]
    if name_or_id in GGML_TYPE_IDS:
        raise ValueError(f"ggml tensor type {name_or_id!r} ({GGML_TYPE_IDS[name_or_id]}) is not supported by "
                         f"scratchlm; {_supported()}")
    raise ValueError(f"unknown ggml type name {name_or_id!r}; {_supported()}")
