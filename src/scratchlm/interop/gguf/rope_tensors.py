"""The RoPE factor tensors of a GGUF file <-> ModelConfig.rope_scaling.

llama.cpp divides each rotation frequency theta_i = base^(-2i/R) (R = rope.dimension_count) by a per-dimension
factor ff_i read from a tensor of R/2 values (ggml's rope with `freq_factors`):

    rope_freqs.weight                  llama, granite: Llama-3.1/3.2's "llama3" scaling, which llama.cpp's
                                       converter stores as this table (no metadata key describes it)
    rope_factors_long / _short.weight  phi3 (llama, granite with rope.scaling.type=longrope): longrope. llama.cpp
                                       takes the long factors when its context n_ctx exceeds
                                       L0 = rope.scaling.original_context_length, else the short ones;
                                       scratchlm (like transformers) decides per forward, by the longest position

Import: a rope_freqs table that llama3 scaling reproduces (to f32 rounding) from some (factor, low_freq_factor,
high_freq_factor, L0) becomes that llama3 dict; any other table becomes the exact "fixed factors" form
{"rope_type": "longrope", short_factor = long_factor = the table, attention_factor 1}: theta_i / ff_i at every
length, whichever factors are picked. Export writes the table of either form (llama3: computed in f32 exactly as
the converter does, conversion/llama.py generate_extra_tensors).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from scratchlm.nn.rope_scaling import longrope_attention_factor

LLAMA3_DEFAULTS = ((1.0, 4.0), 8192)  # Llama 3.1 / 3.2: (low_freq_factor, high_freq_factor), L0
TABLE_RTOL = 1e-6  # a table "reproduces" when every factor agrees to f32 rounding


def llama3_table(scaling: dict[str, Any], base: float, rope_dim: int) -> torch.Tensor:
    """The (R/2,) f32 factor table llama.cpp's converter writes as rope_freqs for a llama3 scaling dict."""
    freqs = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    l0 = scaling["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq  # a 0-dim f32 tensor, as in the converter
        if wavelen < l0 / hi:
            out.append(torch.tensor(1.0))
        elif wavelen > l0 / lo:
            out.append(torch.tensor(float(factor)))
        else:
            smooth = (l0 / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.stack([v.to(torch.float32) for v in out])


def fixed_factors(table: list[float] | torch.Tensor, max_seq_len: int) -> dict[str, Any]:
    """The longrope dict that divides theta_i by table[i] at every length (attention factor 1)."""
    values = [float(v) for v in table]
    return {"rope_type": "longrope", "short_factor": values, "long_factor": list(values),
            "original_max_position_embeddings": max_seq_len, "attention_factor": 1.0}


def is_fixed_factors(scaling: dict[str, Any] | None, max_seq_len: int) -> bool:
    """True for a longrope dict whose two tables are equal and whose attention factor is 1."""
    return (scaling is not None and scaling["rope_type"] == "longrope"
            and list(scaling["short_factor"]) == list(scaling["long_factor"])
            and longrope_attention_factor(scaling, max_seq_len) == 1.0)


def _smooth_l0(table: torch.Tensor, freqs: torch.Tensor, factor: float, lo: float, hi: float) -> int | None:
    """L0 solved from the first dim in the smooth band (1 < ff < factor), or None when there is none."""
    for ff, freq in zip(table.tolist(), freqs.tolist()):
        if 1.0 < ff < factor:
            s = (1 / ff - 1 / factor) / (1 - 1 / factor)  # 1/ff = (1 - s)/factor + s
            return round(2 * math.pi / freq * (s * (hi - lo) + lo))
    return None


def _llama3_candidates(table: torch.Tensor, base: float, rope_dim: int, l0_hint: int | None) -> list[dict[str, Any]]:
    factor = float(table.max())
    freqs = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    (lo, hi), default_l0 = LLAMA3_DEFAULTS
    l0s = [l0 for l0 in (l0_hint, default_l0, _smooth_l0(table, freqs, factor, lo, hi)) if l0 is not None and l0 >= 2]
    return [{"rope_type": "llama3", "factor": factor, "low_freq_factor": lo, "high_freq_factor": hi,
             "original_max_position_embeddings": int(l0)} for l0 in dict.fromkeys(l0s)]


def scaling_from_rope_freqs(table: torch.Tensor, base: float, rope_dim: int, max_seq_len: int,
                            l0_hint: int | None = None) -> dict[str, Any] | None:
    """rope_scaling for a rope_freqs table (module docstring); None when every factor is 1 (plain RoPE)."""
    table = table.to(torch.float32).reshape(-1)
    if table.numel() != rope_dim // 2:
        raise ValueError(f"GGUF tensor rope_freqs.weight has {table.numel()} values; llama.cpp needs "
                         f"rope.dimension_count / 2 = {rope_dim // 2}")
    if not bool((table > 0).all()) or not bool(torch.isfinite(table).all()):
        raise ValueError("GGUF tensor rope_freqs.weight holds factors that are not finite and positive")
    if bool((table == 1).all()):
        return None
    if float(table.max()) > 1 and float(table.min()) == 1.0:
        for candidate in _llama3_candidates(table, base, rope_dim, l0_hint):
            if torch.allclose(llama3_table(candidate, base, rope_dim), table, rtol=TABLE_RTOL, atol=0.0):
                return candidate
    return fixed_factors(table, max_seq_len)


def longrope_from_factors(long: torch.Tensor | None, short: torch.Tensor | None, rope_dim: int, l0: int,
                          attn_factor: float) -> dict[str, Any]:
    """rope_scaling for phi3-style rope_factors_long/short (a missing one: factors 1, as llama.cpp's null
    tensor) with L0 and llama.cpp's rope.scaling.attn_factor (it scales cos and sin, as attention_factor)."""
    tables = {}
    for name, t in (("long_factor", long), ("short_factor", short)):
        values = [1.0] * (rope_dim // 2) if t is None else [float(v) for v in t.reshape(-1)]
        if len(values) != rope_dim // 2:
            raise ValueError(f"GGUF tensor rope_factors_{name.split('_')[0]}.weight has {len(values)} values; "
                             f"llama.cpp needs rope.dimension_count / 2 = {rope_dim // 2}")
        tables[name] = values
    return {"rope_type": "longrope", **tables, "original_max_position_embeddings": l0,
            "attention_factor": float(attn_factor)}


def rope_tensors_for(scaling: dict[str, Any] | None, base: float, rope_dim: int, max_seq_len: int,
                     freqs_tensor: bool = True) -> dict[str, torch.Tensor]:
    """Export: {"rope_freqs.weight": table} for llama3 / fixed factors (where the architecture reads
    rope_freqs: freqs_tensor), the long/short tables for longrope."""
    if scaling is None:
        return {}
    if scaling["rope_type"] == "llama3":
        return {"rope_freqs.weight": llama3_table(scaling, base, rope_dim)}
    if freqs_tensor and is_fixed_factors(scaling, max_seq_len):
        return {"rope_freqs.weight": torch.tensor(scaling["short_factor"], dtype=torch.float32)}
    if scaling["rope_type"] == "longrope":
        return {"rope_factors_long.weight": torch.tensor(scaling["long_factor"], dtype=torch.float32),
                "rope_factors_short.weight": torch.tensor(scaling["short_factor"], dtype=torch.float32)}
    return {}
