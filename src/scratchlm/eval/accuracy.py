"""Accuracy of generated answers: sample n completions per problem, grade each, report pass@k.

For every problem (an RLPrompt: prompt + the grader's fields, e.g. "answer"), n completions are
generated (greedy when temperature = 0, then n must be 1; else sampled at `temperature` with optional
top-p) until the prompt's end token or max_new_tokens, decoded without the end token and graded by a
reward function (align.rewards, e.g. "math"): a sample is correct when its reward is >= 1.
Per problem: c correct of n; pass@k = the unbiased estimator (eval.stats.pass_at_k) for each requested
k <= n; reported as the mean over problems with a 95% interval (Wilson for one 0/1 score per problem).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from tqdm import tqdm

from scratchlm.data.align_data import RLPrompt, encode_prompt, end_token
from scratchlm.eval.stats import mean_interval, pass_at_k
from scratchlm.generate.engine import generate

Grader = Callable[[str, dict[str, Any]], float]


def check_sampling(samples: int, ks: list[int], temperature: float) -> None:
    """Clear errors for settings that cannot give the asked pass@k."""
    if samples < 1:
        raise ValueError(f"samples per problem must be >= 1, got {samples}")
    if temperature == 0 and samples > 1:
        raise ValueError(f"greedy decoding (temperature 0) gives {samples} identical samples; use --samples 1 "
                         "or a temperature > 0")
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= samples={samples}; got k={bad} (raise --samples)")


def generate_samples(model: Any, tok: Any, problems: list[RLPrompt], samples: int, max_new_tokens: int,
                     temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 16,
                     stop_ids: list[int] | None = None, progress: bool = True) -> list[list[str]]:
    """texts[i][j]: completion j of problem i, decoded without its end token."""
    per_batch = max(1, batch_size // samples)
    out: list[list[str]] = []
    bar = tqdm(range(0, len(problems), per_batch), desc="generate", disable=not progress, unit="batch")
    for b, s in enumerate(bar):
        part = problems[s:s + per_batch]
        prompts = [p.ids if p.ids is not None else encode_prompt(tok, p.prompt) for p in part]
        ends = [p.end_id if p.end_id is not None else end_token(tok, p.prompt) for p in part]
        rows = [ids for ids in prompts for _ in range(samples)]
        sampling = {"temperature": temperature} if temperature == 0 else {"temperature": temperature, "top_p": top_p}
        outs = generate(model, rows, max_new_tokens, stop_token_ids=sorted(set(ends) | set(stop_ids or [])),
                        seed=seed * 1_000_003 + b, **sampling)
        for i, end in enumerate(ends):
            texts = []
            for row in outs[i * samples:(i + 1) * samples]:
                body = row[:-1] if row and (row[-1] == end or row[-1] in (stop_ids or ())) else row
                texts.append(tok.decode(body))
            out.append(texts)
    return out


@torch.no_grad()
def evaluate_accuracy(model: Any, tok: Any, problems: list[RLPrompt], grader: Grader, samples: int = 1,
                      ks: list[int] | None = None, max_new_tokens: int = 256, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0, batch_size: int = 16, stop_ids: list[int] | None = None,
                      progress: bool = True) -> dict[str, Any]:
    """Generate, grade and summarise (module docstring); returns {"summary": ..., "items": [...]}."""
    ks = ks or [1]
    check_sampling(samples, ks, temperature)
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        texts = generate_samples(model, tok, problems, samples, max_new_tokens, temperature, top_p, seed,
                                 batch_size, stop_ids, progress)
    finally:
        model.train(was_training)
    return grade_samples(problems, texts, grader, ks)


def grade_samples(problems: list[RLPrompt], texts: list[list[str]], grader: Grader, ks: list[int]) -> dict[str, Any]:
    """Grade every sample and summarise pass@k with intervals (module docstring)."""
    items, per_k = [], {k: [] for k in ks}
    for problem, completions in zip(problems, texts):
        correct = [grader(t, problem.fields) >= 1.0 for t in completions]
        n, c = len(correct), sum(correct)
        for k in ks:
            per_k[k].append(pass_at_k(n, c, k))
        items.append({"prompt": problem.prompt, **problem.fields, "completions": completions, "correct": correct})
    summary: dict[str, Any] = {"problems": len(problems), "samples_per_problem": len(texts[0]) if texts else 0}
    for k in ks:
        scores = per_k[k]
        summary[f"pass@{k}"] = sum(scores) / len(scores)
        summary[f"pass@{k}_ci95"] = list(mean_interval(scores))
    summary["sample_accuracy"] = sum(sum(it["correct"]) for it in items) / max(1, sum(len(t) for t in texts))
    return {"summary": summary, "items": items}
