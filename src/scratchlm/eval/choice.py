"""Multiple choice by log-likelihood: the option the model finds most likely as a continuation of the prompt.

For an item (prompt x, options y_1..y_m, the correct index a), with S(y) = sum_j log p(y_j | x, y_<j):
    acc            argmax_i S(y_i) == a                    (unnormalised: favours short options)
    acc_norm       argmax_i S(y_i) / chars(y_i) == a       (per character, lm-evaluation-harness's acc_norm)
    acc_per_token  argmax_i S(y_i) / tokens(y_i) == a      (per token)
Encoding as lm-evaluation-harness does: trailing whitespace of the prompt moves to the start of the
option, then option tokens = tokens(prompt + option) minus the prompt's own tokens when those are a
prefix (so BPE merges across the boundary are the ones the model would see), else tokens(option).
A prompt given as chat messages is rendered with the generation prompt and the option encoded alone.
Ties go to the first option. Each metric is reported with its 95% Wilson interval over the N items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from scratchlm.align.graders import choice_letter
from scratchlm.align.logprobs import sequence_logprobs
from scratchlm.data.align_data import encode_prompt
from scratchlm.data.chat_format import ChatFormat
from scratchlm.eval.stats import wilson_interval

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
METRICS = ("acc", "acc_norm", "acc_per_token")


@dataclass
class ChoiceItem:
    prompt: str | list[dict[str, str]]
    choices: list[str]
    answer: int  # index of the correct option
    fields: dict[str, Any] = field(default_factory=dict)


def parse_answer(answer: Any, n_choices: int) -> int:
    """The correct option's index from an index or a letter ("B", "(b)")."""
    letter = choice_letter(answer, LETTERS[:n_choices])
    return LETTERS.index(letter)


def encode_pair(tok: Any, prompt: str | list, option: str,
                fmt: ChatFormat | None = None) -> tuple[list[int], list[int]]:
    """(context ids, option ids) as in the module docstring."""
    if isinstance(prompt, list):
        return encode_prompt(tok, prompt, fmt), list(tok.encode(option))
    stripped = prompt.rstrip()
    option = prompt[len(stripped):] + option
    context = list(tok.encode(stripped))
    whole = list(tok.encode(stripped + option))
    if whole[: len(context)] == context and len(whole) > len(context):
        return context, whole[len(context):]
    return context, list(tok.encode(option))


@torch.no_grad()
def option_scores(model: Any, tok: Any, items: list[ChoiceItem], batch_size: int = 16,
                  fmt: ChatFormat | None = None, progress: bool = True) -> list[list[tuple[float, int]]]:
    """scores[i][j] = (S(option j of item i), its token count)."""
    rows = [(i, encode_pair(tok, it.prompt, opt, fmt)) for i, it in enumerate(items) for opt in it.choices]
    for i, (ctx, opt) in rows:
        if not ctx or not opt:
            raise ValueError(f"item {i}: the prompt and every option need at least one token")
    flat: list[tuple[float, int]] = []
    bar = tqdm(range(0, len(rows), batch_size), desc="choices", disable=not progress, unit="batch")
    for s in bar:
        part = rows[s:s + batch_size]
        sums, counts = sequence_logprobs(model, [c for _, (c, _) in part], [o for _, (_, o) in part])
        flat += [(float(a), int(b)) for a, b in zip(sums.double().cpu(), counts.cpu())]
    out, k = [], 0
    for it in items:
        out.append(flat[k:k + len(it.choices)])
        k += len(it.choices)
    return out


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda j: (values[j], -j))


def evaluate_choices(model: Any, tok: Any, items: list[ChoiceItem], batch_size: int = 16,
                     fmt: ChatFormat | None = None, progress: bool = True) -> dict[str, Any]:
    """acc / acc_norm / acc_per_token with 95% intervals, and per-item scores (module docstring)."""
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        scores = option_scores(model, tok, items, batch_size, fmt, progress)
    finally:
        model.train(was_training)
    hits = {m: 0 for m in METRICS}
    records = []
    for it, sc in zip(items, scores):
        sums = [s for s, _ in sc]
        preds = {"acc": _argmax(sums),
                 "acc_norm": _argmax([s / max(len(c), 1) for s, c in zip(sums, it.choices)]),
                 "acc_per_token": _argmax([s / n for s, n in sc])}
        for m in METRICS:
            hits[m] += preds[m] == it.answer
        records.append({"prompt": it.prompt, "choices": it.choices, "answer": it.answer, "logprobs": sums,
                        "predicted": preds})
    n = len(items)
    summary: dict[str, Any] = {"items": n}
    for m in METRICS:
        summary[m] = hits[m] / n
        summary[f"{m}_ci95"] = list(wilson_interval(hits[m], n))
    return {"summary": summary, "items": records}
