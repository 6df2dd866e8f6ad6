"""The reasoning format reward: `<think>...</think> <answer>...</answer>` (DeepSeek-R1-Zero's template).

A completion is well formed (reward 1.0, else 0.0) when, after stripping outer whitespace, it is
    [<think>] THINKING </think> WHITESPACE? <answer> ANSWER </answer>
with exactly one </think>, one <answer> and one </answer>, at most one <think>, non-empty THINKING and
ANSWER, nothing after </answer> and nothing before <think> (when present). The opening <think> is
optional because R1-Zero-style prompts end with "<think>" themselves, so the completion starts inside
the thinking block.
`think_answer(text)` returns ANSWER of a well-formed completion (else None), for the answer reward.
"""

from __future__ import annotations

import re

_FORMAT_RE = re.compile(r"^(?:<think>)?(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>$", re.DOTALL)


def think_answer(text: str) -> str | None:
    """ANSWER of a well-formed completion (module docstring), or None."""
    s = text.strip()
    counts = {tag: s.count(tag) for tag in ("<think>", "</think>", "<answer>", "</answer>")}
    if counts["<think>"] > 1 or any(counts[t] != 1 for t in ("</think>", "<answer>", "</answer>")):
        return None
    if counts["<think>"] == 1 and not s.startswith("<think>"):
        return None
    m = _FORMAT_RE.match(s)
    if m is None or not m.group("think").strip() or not m.group("answer").strip():
        return None
    return m.group("answer").strip()


def format_reward(text: str) -> float:
    """1.0 for a well-formed <think>/<answer> completion, else 0.0."""
    return float(think_answer(text) is not None)
