"""RoPE scaling: how the rotation frequencies theta_i = base^(-2i/d) are changed to stretch a model's context.

Every variant returns new inverse frequencies inv_freq (d/2,) and an attention factor a that multiplies
cos and sin (so q.k scales by a^2). d = head_dim, L0 = original_max_position_embeddings (the
pre-training context), s = factor.

  linear    theta_i' = theta_i / s                                   (position interpolation, Chen et al. 2023)
  dynamic   NTK-aware, per forward: with L = max(max position + 1, L0),
            base' = base * (s * L / L0 - (s - 1))^(d / (d - 2)),  theta_i' = base'^(-2i/d)
            (= plain RoPE while L <= L0; the frequencies follow the longest position of *this* forward,
            keys already cached keep the rotation they were written with — as transformers does)
  llama3    wavelength w_i = 2 pi / theta_i; w_low = L0 / low_freq_factor, w_high = L0 / high_freq_factor:
            w_i < w_high: theta_i (high frequencies kept);  w_i > w_low: theta_i / s;
            otherwise (1 - m) theta_i / s + m theta_i,  m = (L0 / w_i - low_freq_factor) / (high - low)
  yarn      "NTK-by-parts" (Peng et al. 2023): r(n) = (d ln(L0 / (2 pi n)) / (2 ln base)) is the dim that
            turns n times over L0; lo = r(beta_fast), hi = r(beta_slow) (floor/ceil unless truncate=False),
            clamped to [0, d - 1]; ramp_i = clamp((i - lo) / (hi - lo), 0, 1) for i < d/2;
            theta_i' = theta_i / s * ramp_i + theta_i * (1 - ramp_i);
            a = attention_factor, else 0.1 ln(s) + 1 (or the mscale / mscale_all_dim ratio of those)
  longrope  (Phi-3 "su"): theta_i' = theta_i / f_i with f = long_factor when the forward's longest position
            + 1 > L0, else short_factor (one choice per forward, like transformers);
            a = attention_factor, else sqrt(1 + ln(s) / ln(L0)) with s = factor or max_seq_len / L0 (1 if s <= 1)

The dict layout follows transformers' `rope_parameters` (minus rope_theta, which is ModelConfig.rope_base):
{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
"original_max_position_embeddings": 8192}. Tables are computed in float64 and stored as fp32.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# rope_type -> (required keys, optional keys)
ROPE_SCALING_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "linear": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor", "original_max_position_embeddings"}), frozenset()),
    "llama3": (frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
               frozenset()),
    "yarn": (frozenset({"factor", "original_max_position_embeddings"}),
             frozenset({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"})),
    "longrope": (frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
                 frozenset({"factor", "attention_factor"})),
}
ROPE_SCALING_TYPES = tuple(ROPE_SCALING_KEYS)


def _number(scaling: dict[str, Any], key: str, minimum: float, strict: bool = False) -> None:
    value = scaling.get(key)
    if value is None and key not in ROPE_SCALING_KEYS[scaling["rope_type"]][0]:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"ModelConfig.rope_scaling[{key!r}]={value!r} must be a number {bound}")


def check_rope_scaling(scaling: dict[str, Any], head_dim: int) -> None:
    """ValueError naming the key when `scaling` is not a valid rope_scaling dict for this head_dim."""
    if not isinstance(scaling, dict):
        raise ValueError(f"ModelConfig.rope_scaling must be a dict like {{'rope_type': 'linear', 'factor': 2.0}}, "
                         f"got {scaling!r}")
    kind = scaling.get("rope_type")
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(f"ModelConfig.rope_scaling['rope_type']={kind!r} is not one of {ROPE_SCALING_TYPES}")
    required, optional = ROPE_SCALING_KEYS[kind]
    missing = sorted(required - set(scaling))
    unknown = sorted(set(scaling) - required - optional - {"rope_type"})
    if missing or unknown:
        raise ValueError(f"ModelConfig.rope_scaling for rope_type={kind!r}: missing {missing}, unknown {unknown}; "
                         f"required {sorted(required)}, optional {sorted(optional)}")
    if "original_max_position_embeddings" in required:
        l0 = scaling["original_max_position_embeddings"]
        if not isinstance(l0, int) or isinstance(l0, bool) or l0 < 2:
            raise ValueError(f"ModelConfig.rope_scaling['original_max_position_embeddings']={l0!r} must be an "
                             "integer >= 2")
    for key in ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                "low_freq_factor", "high_freq_factor"):
        if key in scaling:
            _number(scaling, key, 0.0, strict=key in ("factor", "low_freq_factor", "high_freq_factor"))
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError("ModelConfig.rope_scaling: llama3 needs high_freq_factor > low_freq_factor, got "
                         f"{scaling['high_freq_factor']} <= {scaling['low_freq_factor']}")
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            f = scaling[key]
            if not isinstance(f, (list, tuple)) or len(f) != head_dim // 2 or not all(
                    isinstance(x, (int, float)) and x > 0 for x in f):
                raise ValueError(f"ModelConfig.rope_scaling[{key!r}] must be a list of head_dim/2 = {head_dim // 2} "
                                 f"positive numbers, got {f!r}")


def default_inv_freq(head_dim: int, base: float | torch.Tensor) -> torch.Tensor:
    """theta_i = base^(-2i/d), i in [0, d/2): (d/2,) float64 (base may be a 0-dim tensor)."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def llama3_inv_freq(inv: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's smooth split: high frequencies kept, low ones divided by factor, a linear blend between."""
    factor, lo, hi, l0 = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > l0 / lo, inv / factor, inv)
    m = (l0 / wavelen - lo) / (hi - lo)
    smoothed = (1 - m) * scaled / factor + m * scaled
    medium = (wavelen >= l0 / hi) & (wavelen <= l0 / lo)
    return torch.where(medium, smoothed, scaled)


def yarn_attention_factor(s: dict[str, Any]) -> float:
    """a = attention_factor, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) or mscale(factor, 1),
    mscale(f, m) = 0.1 m ln f + 1 (1 when f <= 1)."""
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])

    def mscale(f: float, m: float = 1.0) -> float:
        return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(s["factor"], s["mscale"]) / mscale(s["factor"], s["mscale_all_dim"])
    return mscale(s["factor"])


def yarn_inv_freq(head_dim: int, base: float, s: dict[str, Any]) -> torch.Tensor:
    """NTK-by-parts: interpolate the low-frequency dims, keep the high-frequency ones, ramp in between."""
    factor, l0 = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def dim_of(turns: float) -> float:  # the dim index that makes `turns` full turns over L0
        return head_dim * math.log(l0 / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if s.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    if lo == hi:
        hi += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    inv = default_inv_freq(head_dim, base)
    return inv / factor * ramp + inv * (1 - ramp)


def longrope_attention_factor(s: dict[str, Any], max_seq_len: int) -> float:
    """a = attention_factor, else sqrt(1 + ln(s) / ln(L0)) with s = factor or max_seq_len / L0 (1 if s <= 1)."""
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    l0 = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_seq_len / l0
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(l0))


def scaled_inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None, max_seq_len: int,
                    long: bool = False) -> tuple[torch.Tensor, float]:
    """(inv_freq (d/2,) float64, attention factor) of a static scaling (None, linear, llama3, yarn, longrope);
    `long` picks longrope's long factors. dynamic returns the unscaled frequencies (see dynamic_inv_freq)."""
    inv = default_inv_freq(head_dim, base)
    kind = None if scaling is None else scaling["rope_type"]
    if kind == "linear":
        return inv / scaling["factor"], 1.0
    if kind == "llama3":
        return llama3_inv_freq(inv, scaling), 1.0
    if kind == "yarn":
        return yarn_inv_freq(head_dim, base, scaling), yarn_attention_factor(scaling)
    if kind == "longrope":
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float64)
        return inv / factors, longrope_attention_factor(scaling, max_seq_len)
    return inv, 1.0


def dynamic_inv_freq(head_dim: int, base: float, scaling: dict[str, Any], seq_len: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK: base' = base (s L / L0 - (s - 1))^(d / (d - 2)), L = max(seq_len, L0) (a 0-dim tensor)."""
    factor, l0 = scaling["factor"], scaling["original_max_position_embeddings"]
    length = seq_len.to(torch.float64).clamp_min(l0)
    new_base = base * (factor * length / l0 - (factor - 1)) ** (head_dim / (head_dim - 2))
    return default_inv_freq(head_dim, new_base)
