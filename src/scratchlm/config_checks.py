"""Validation of ModelConfig's architecture-feature fields (kept apart so config.py stays readable).

Each check raises ValueError naming the field, its value and what would be valid.
"""

from __future__ import annotations

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
