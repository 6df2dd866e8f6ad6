"""The weight formats of the fast decode modes: their names and the matrix widths their kernels take.

Every matrix's input dim (d_model, n_heads * head_dim, d_ff) must be a multiple of the format's
K_MULTIPLE: torch's int8 kernel reads 16 lanes at a time (wrong results or a crash otherwise), our
kernels 16 lanes (bf16) or whole 32-value blocks (Q8_0, Q4_1 and their A8 forms).
"""

from __future__ import annotations

from scratchlm.config import ModelConfig
from scratchlm.generate.packed_linear import WEIGHT_FORMATS

QUANT_MODES = WEIGHT_FORMATS  # FastDecoder's quant= values (generate/packed_linear.py)


INT8_K_MULTIPLE = 16  # torch's CPU int8 kernel reads its input dim in blocks of 16 (wrong results or a crash otherwise)
K_MULTIPLE = {"int8": INT8_K_MULTIPLE, "bf16": 16, "q8_0": 32, "q4_1": 32, "q8_0_a8": 32,
              "q4_1_a8": 32}  # our kernels: 16 lanes, 32-blocks
MODE_NAMES = {"int8": "fast-int8", "bf16": "fast-bf16", "q8_0": "fast-q8_0", "q4_1": "fast-q4_1",
              "q8_0_a8": "fast-q8_0-a8", "q4_1_a8": "fast-q4_1-a8"}


def check_format_dims(c: ModelConfig, quant: str = "int8") -> None:
    """ValueError unless every matrix's input dim (d_model, n_heads*head_dim, d_ff) is a multiple of the
    weight format's K_MULTIPLE."""
    if quant not in K_MULTIPLE:
        return
    multiple = K_MULTIPLE[quant]
    dims = {"d_model": c.d_model, "n_heads*head_dim": c.n_heads * c.head_dim, "d_ff": c.d_ff}
    bad = {k: v for k, v in dims.items() if v % multiple}
    if bad:
        raise ValueError(f"decode='{MODE_NAMES[quant]}' needs {sorted(dims)} to be multiples of {multiple} (its "
                         f"kernel), got {bad}; use decode='fast' for this model")
