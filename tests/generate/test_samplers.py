"""Samplers vs hand-worked examples, vs HF transformers' logits processors, and a seeded frequency test."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from scratchlm.generate.sampling import (
    SamplingParams,
    apply_frequency_presence_penalty,
    apply_repetition_penalty,
    apply_temperature,
    choose_next_token,
    make_generator,
    min_p_filter,
    process_logits,
    sample_from_logits,
    token_counts,
    top_k_filter,
    top_p_filter,
)

INF = float("inf")


def kept(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


# ---- hand-worked examples -------------------------------------------------------------------------

def test_repetition_penalty_by_hand() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0]])
    counts = torch.tensor([[1, 2, 0, 0]])
    out = apply_repetition_penalty(logits, counts, 2.0)
    # seen: 2.0 / 2 = 1.0, -1.0 * 2 = -2.0; unseen unchanged
    assert out.tolist() == [[1.0, -2.0, 0.5, -3.0]]


def test_frequency_presence_penalty_by_hand() -> None:
    logits = torch.tensor([[1.0, 1.0, 1.0]])
    counts = torch.tensor([[0, 1, 3]])
    out = apply_frequency_presence_penalty(logits, counts, frequency=0.5, presence=0.25)
    assert out.tolist() == [[1.0, 1.0 - 0.5 - 0.25, 1.0 - 1.5 - 0.25]]


def test_temperature_by_hand() -> None:
    assert apply_temperature(torch.tensor([[1.0, -2.0]]), 0.5).tolist() == [[2.0, -4.0]]
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(torch.tensor([[1.0]]), 0.0)


def test_top_k_by_hand_keeps_ties() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 3.0, 0.0]])
    assert kept(top_k_filter(logits, 2)) == [1, 2, 3]  # the 2nd largest (3.0) is tied: both kept
    assert kept(top_k_filter(logits, 1)) == [1]
    assert kept(top_k_filter(logits, 0)) == [0, 1, 2, 3, 4]


def test_top_p_by_hand() -> None:
    probs = torch.tensor([[0.12, 0.5, 0.3, 0.08]])
    logits = probs.log()
    # sorted: 0.5, 0.3, 0.12, 0.08 -> cumulative 0.5, 0.8, 0.92, 1: p=0.7 needs {0.5, 0.3}
    # (p values sit away from the cumulative sums: at an exact tie fp32 rounding decides)
    assert kept(top_p_filter(logits, 0.7)) == [1, 2]
    assert kept(top_p_filter(logits, 0.45)) == [1]  # 0.5 alone reaches p = 0.45
    assert kept(top_p_filter(logits, 0.85)) == [0, 1, 2]  # 0.8 < 0.85: 0.12 is needed too
    assert kept(top_p_filter(logits, 0.01)) == [1]  # always at least one token
    assert kept(top_p_filter(logits, 1.0)) == [0, 1, 2, 3]


def test_min_p_by_hand() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.3, 0.15]])
    # threshold 0.4 * 0.5 = 0.2 keeps 0.5 and 0.3
    assert kept(min_p_filter(probs.log(), 0.4)) == [1, 2]
    assert kept(min_p_filter(probs.log(), 0.0)) == [0, 1, 2, 3]


def test_token_counts_ignores_padding() -> None:
    ids = torch.tensor([[0, 0, 3, 3, 1]])
    valid = torch.tensor([[False, False, True, True, True]])
    assert token_counts(ids, 5, valid).tolist() == [[0, 1, 0, 2, 0]]


def test_greedy_is_argmax_after_penalty() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    counts = torch.tensor([[1, 0, 0]])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)  # 3.0 -> 1.5 < 2.5
    assert choose_next_token(logits, params, counts).tolist() == [1]


@pytest.mark.parametrize(
    "field, value",
    [("temperature", -1.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5), ("min_p", 1.0),
     ("repetition_penalty", 0.0), ("frequency_penalty", 3.0), ("presence_penalty", -2.5)],
)
def test_invalid_params_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


# ---- against HF transformers' processors on the same inputs ---------------------------------------

@pytest.fixture
def random_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 97, generator=g) * 3
    history = torch.randint(0, 97, (6, 12), generator=g)
    return logits, history


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_matches_hf(random_batch, penalty: float) -> None:
    logits, history = random_batch
    ours = apply_repetition_penalty(logits, token_counts(history, 97), penalty)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


WARPERS = [
    *[(apply_temperature, TemperatureLogitsWarper, t) for t in (0.3, 1.0, 1.7)],
    *[(top_k_filter, TopKLogitsWarper, k) for k in (1, 5, 50)],
    *[(top_p_filter, TopPLogitsWarper, p) for p in (0.05, 0.5, 0.9, 0.99)],
    *[(min_p_filter, MinPLogitsWarper, m) for m in (0.01, 0.1, 0.5)],
]


@pytest.mark.parametrize("ours, theirs, value", WARPERS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_warpers_match_hf(random_batch, ours, theirs, value) -> None:
    logits, history = random_batch
    expected = theirs(value)(history, logits.clone())
    torch.testing.assert_close(ours(logits, value), expected, rtol=0, atol=0)


def test_processor_chain_matches_hf_order(random_batch) -> None:
    logits, history = random_batch
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2)
    theirs = logits.clone()
    for proc in (RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.8), TopKLogitsWarper(40),
                 TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)):
        theirs = proc(history, theirs)
    torch.testing.assert_close(process_logits(logits, params, token_counts(history, 97)), theirs, rtol=0, atol=0)


# ---- sampling frequencies -------------------------------------------------------------------------

def test_sampling_frequencies_match_filtered_distribution() -> None:
    """50k seeded draws from top-p(0.75)-filtered logits: every token within 5 sigma of its probability,
    and filtered tokens never drawn (chi-square would be the same idea; 5 sigma keeps it stable)."""
    logits = torch.log(torch.tensor([[0.4, 0.25, 0.15, 0.1, 0.06, 0.04]]))
    filtered = top_p_filter(logits, 0.75)  # keeps 0.4, 0.25, 0.15 (mass before 0.1 is 0.8 >= 0.75)
    target = torch.softmax(filtered, dim=-1)[0]
    n = 50_000
    draws = sample_from_logits(filtered.expand(n, -1), make_generator(123))
    freq = torch.bincount(draws, minlength=6).double() / n
    sigma = (target.double() * (1 - target.double()) / n).sqrt()
    assert freq[3:].sum().item() == 0.0
    assert ((freq - target.double()).abs() <= 5 * sigma + 1e-12).all(), (freq.tolist(), target.tolist())
    torch.testing.assert_close(target[:3].sum(), torch.tensor(1.0))
    assert math.isclose(target[0].item(), 0.4 / 0.8, rel_tol=1e-5)


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = torch.randn(4, 50)
    params = SamplingParams(temperature=1.0)
    a = choose_next_token(logits, params, generator=make_generator(7))
    b = choose_next_token(logits, params, generator=make_generator(7))
    draws = {tuple(choose_next_token(logits, params, generator=make_generator(s)).tolist()) for s in range(8)}
    assert a.tolist() == b.tolist()
    assert len(draws) > 1
