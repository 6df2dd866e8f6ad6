"""Sampling: pure functions on next-token logits, written from scratch.

Shapes: logits (B, V) fp32, counts (B, V) = how often each token id already occurs in the row
(prompt + generated so far). Every filter returns new logits with removed tokens at -inf; nothing
is modified in place. Order used by `process_logits` (the same as HF `generate`):
    penalties -> temperature -> top-k -> top-p -> min-p

Penalties (applied only to tokens seen in the row, `counts > 0`):
    repetition (CTRL / HF convention):  l' = l / r if l > 0 else l * r      (r > 1 discourages repeats)
    frequency / presence (OpenAI):      l' = l - f * count - p * [count > 0]
Warpers:
    temperature:  l' = l / T                       (T > 0; T = 0 means greedy, handled by the caller)
    top-k:        keep tokens with l >= the k-th largest logit (ties at the boundary are kept)
    top-p:        sort probabilities descending; keep token i iff the mass strictly before it is < p,
                  i.e. the smallest prefix with cumulative probability >= p; always >= 1 token
    min-p:        keep tokens with prob >= min_p * max_prob (Nguyen et al. 2024)
Drawing a token (`sample_from_logits`): the exponential race, equivalent to Gumbel-max,
    i* = argmax_i p_i / E_i,   E_i ~ Exp(1) i.i.d.     =>   P(i* = i) = p_i
(E_i / p_i ~ Exp(p_i) and the minimum of independent exponentials is i with probability p_i / sum p),
drawn from a seeded torch.Generator for reproducibility; greedy is argmax (first index on ties).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scratchlm.nn.softmax import softmax

NEG_INF = float("-inf")


def apply_repetition_penalty(logits: torch.Tensor, counts: torch.Tensor, penalty: float) -> torch.Tensor:
    """Seen tokens: positive logits divided by `penalty`, negative ones multiplied (HF convention)."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(counts > 0, penalised, logits)


def apply_frequency_presence_penalty(
    logits: torch.Tensor, counts: torch.Tensor, frequency: float, presence: float
) -> torch.Tensor:
    """l - frequency * count - presence * [count > 0] (OpenAI's definition)."""
    if frequency == 0.0 and presence == 0.0:
        return logits
    c = counts.to(logits.dtype)
    return logits - frequency * c - presence * (c > 0).to(logits.dtype)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """l / T for T > 0.

    When l / T would overflow (tiny T, e.g. 1e-40: the top logit becomes +inf and softmax NaN), the
    row max m is subtracted first, which softmax ignores: (l - m) / T, with the max itself kept at 0
    (1 / T itself may overflow float32, and 0 * inf is NaN). The result is then the greedy limit:
    the top token (ties shared) gets all the probability."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to scale logits, got {temperature}; use greedy for 0")
    if temperature == 1.0:
        return logits
    finfo = torch.finfo(logits.dtype)
    peak = float(logits.masked_fill(~torch.isfinite(logits), 0).abs().amax()) if logits.numel() else 0.0
    if temperature >= finfo.tiny and peak / temperature < finfo.max / 2:
        return logits / temperature
    top = logits.amax(dim=-1, keepdim=True)
    shifted = logits - torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # <= 0, the max at 0
    return torch.where(shifted < 0, shifted / temperature, torch.zeros_like(shifted))


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row (and any tied with the k-th); k <= 0 or k >= V keeps all."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Nucleus filter: the smallest set of most likely tokens with cumulative probability >= p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = softmax(sorted_logits.float(), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability strictly above token i
    remove_sorted = mass_before >= p
    remove_sorted[..., :min_tokens_to_keep] = False
    remove = torch.empty_like(remove_sorted).scatter_(-1, order, remove_sorted)  # back to vocab order
    return logits.masked_fill(remove, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the row's top probability."""
    if min_p <= 0.0:
        return logits
    probs = softmax(logits.float(), dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # (B, 1)
    return logits.masked_fill(probs < threshold, NEG_INF)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature 0 = greedy; 0 / 1.0 values switch a filter off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        checks = (
            ("temperature", self.temperature >= 0, ">= 0 (0 = greedy)"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "an integer >= 0 (0 = off)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1] (1 = off)"),
            ("min_p", 0.0 <= self.min_p < 1.0, "in [0, 1) (0 = off)"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0 (1 = off, > 1 discourages repeats)"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2] (0 = off)"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2] (0 = off)"),
        )
        for name, ok, valid in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r} is invalid; it must be {valid}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_counts(self) -> bool:
        """True when a penalty needs the per-row token counts."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


def process_logits(logits: torch.Tensor, params: SamplingParams, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Apply penalties then (unless greedy) temperature, top-k, top-p and min-p. logits (B, V) -> (B, V)."""
    if params.uses_counts:
        if counts is None:
            raise ValueError("penalties need the per-row token counts (B, V); pass counts=token_counts(...)")
        logits = apply_repetition_penalty(logits, counts, params.repetition_penalty)
        logits = apply_frequency_presence_penalty(logits, counts, params.frequency_penalty, params.presence_penalty)
    if params.greedy:
        return logits
    logits = apply_temperature(logits, params.temperature)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return min_p_filter(logits, params.min_p)


def sample_from_logits(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from softmax(logits) by the exponential race. (B, V) -> (B,) int64."""
    probs = softmax(logits.float(), dim=-1)
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)  # E_i ~ Exp(1)
    return torch.argmax(probs / race, dim=-1)


def choose_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    counts: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token per row: argmax when greedy, else a draw from the processed distribution. (B,) int64."""
    logits = process_logits(logits.float(), params, counts)
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    return sample_from_logits(logits, generator)


def token_counts(ids: torch.Tensor, vocab_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """counts[b, v] = number of positions t with ids[b, t] == v (and valid[b, t]). ids (B, T) -> (B, V) int32."""
    counts = torch.zeros(ids.shape[0], vocab_size, dtype=torch.int32, device=ids.device)
    ones = torch.ones_like(ids, dtype=torch.int32) if valid is None else valid.to(torch.int32)
    return counts.scatter_add_(1, ids, ones)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A torch.Generator seeded with `seed` (reproducible draws), or None (global RNG) when seed is None."""
    if seed is None:
        return None
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return torch.Generator(device=device).manual_seed(seed)
