"""Validation of ModelConfig's architecture-feature fields (kept apart so config.py stays readable).

Each check raises ValueError naming the field, its value and what would be valid.
"""

from __future__ import annotations

import math
from typing import Any

LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_attention_layout(c: Any) -> None:
    """sliding_window (a positive int or None) and layer_types (one valid entry per layer, or None)."""
    if c.sliding_window is not None and not _positive_int(c.sliding_window):
        raise ValueError(f"ModelConfig.sliding_window must be a positive integer or None, got {c.sliding_window!r}")
    if c.layer_types is None:
        return
    c.layer_types = tuple(c.layer_types)
    if len(c.layer_types) != c.n_layers:
        raise ValueError(f"ModelConfig.layer_types has {len(c.layer_types)} entries for n_layers={c.n_layers}; "
                         "give one per layer (or None)")
    bad = sorted({t for t in c.layer_types if t not in LAYER_TYPES})
    if bad:
        raise ValueError(f"ModelConfig.layer_types has {bad}; valid entries: {LAYER_TYPES}")
    if "sliding_attention" in c.layer_types and c.sliding_window is None:
        raise ValueError("ModelConfig.layer_types has 'sliding_attention' layers but sliding_window is None; "
                         "set sliding_window to the window size")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_scalars(c: Any) -> None:
    """Multipliers, soft-caps, the attention scale and the local RoPE base; norm_unit_offset needs RMSNorm."""
    for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        if not _positive_number(getattr(c, name)):
            raise ValueError(f"ModelConfig.{name} must be a finite number > 0, got {getattr(c, name)!r}")
    for name in ("attn_scale", "attn_softcap", "final_softcap"):
        value = getattr(c, name)
        if value is not None and not _positive_number(value):
            raise ValueError(f"ModelConfig.{name} must be a finite number > 0 or None, got {value!r}")
    if c.rope_local_base is not None:
        if c.pos_embedding != "rope" or not _positive_number(c.rope_local_base) or c.rope_local_base <= 1:
            raise ValueError(f"ModelConfig.rope_local_base={c.rope_local_base!r} must be a number > 1 (with "
                             f"pos_embedding='rope', got {c.pos_embedding!r}) or None")
    c.nope_layers = tuple(c.nope_layers)
    bad = [i for i in c.nope_layers if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < c.n_layers]
    if bad or len(set(c.nope_layers)) != len(c.nope_layers) or (c.nope_layers and c.pos_embedding != "rope"):
        raise ValueError(f"ModelConfig.nope_layers={list(c.nope_layers)} must list distinct layer indices in "
                         f"[0, n_layers={c.n_layers}) of a pos_embedding='rope' model")
    if c.norm_unit_offset and c.norm != "rmsnorm":
        raise ValueError(f"ModelConfig.norm_unit_offset=True needs norm='rmsnorm', got {c.norm!r}")


def check_moe(c: Any) -> None:
    """moe_*: sizes, top_k <= experts, dense-layer indices, a gated FFN for the experts."""
    c.moe_dense_layers = tuple(c.moe_dense_layers)
    for name in ("moe_num_experts", "moe_shared_d_ff"):
        value = getattr(c, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"ModelConfig.{name} must be an integer >= 0, got {value!r}")
    if c.moe_d_ff is None:
        c.moe_d_ff = c.d_ff
    if not _positive_int(c.moe_d_ff):
        raise ValueError(f"ModelConfig.moe_d_ff must be a positive integer, got {c.moe_d_ff!r}")
    if not isinstance(c.moe_aux_loss_coef, (int, float)) or not c.moe_aux_loss_coef >= 0:
        raise ValueError(f"ModelConfig.moe_aux_loss_coef must be a number >= 0, got {c.moe_aux_loss_coef!r}")
    if c.moe_num_experts == 0:
        return
    if not _positive_int(c.moe_top_k) or c.moe_top_k > c.moe_num_experts:
        raise ValueError(f"ModelConfig.moe_top_k={c.moe_top_k!r} must be in [1, moe_num_experts="
                         f"{c.moe_num_experts}]")
    bad = [i for i in c.moe_dense_layers if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < c.n_layers]
    if bad:
        raise ValueError(f"ModelConfig.moe_dense_layers has {bad}: indices must be in [0, n_layers={c.n_layers})")
    if c.ffn == "mlp":
        raise ValueError("ModelConfig.moe_num_experts > 0 needs a gated FFN (ffn='swiglu' or 'glu'): experts are "
                         "gated FFNs")
