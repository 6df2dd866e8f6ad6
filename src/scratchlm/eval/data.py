"""Evaluation data files, JSONL with one object per line (a bad line fails with `FILE line N: ...`).

    perplexity   a .jsonl of {"text": str} (one document per line), or any other file read as one text
    accuracy     {"prompt": str | messages, "answer": ..., ...}: every field but "prompt" goes to the grader
    choice       {"prompt" (or "question"): str | messages, "choices": [str, ...], "answer": "B" | 1}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scratchlm.data.align_data import RLPrompt
from scratchlm.data.jsonl import check_messages, read_jsonl, require_str
from scratchlm.eval.choice import ChoiceItem, parse_answer


def load_texts(path: str | Path) -> list[str]:
    """Documents: the "text" of each JSONL line, or the whole file."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path, lambda r: require_str(r, "text"), "text")
    if not path.is_file():
        raise FileNotFoundError(f"text file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"{path} is empty; there is nothing to score")
    return [text]


def _prompt(record: dict[str, Any], key: str = "prompt") -> str | list[dict[str, str]]:
    value = record.get(key)
    return check_messages(value, key) if isinstance(value, list) else require_str(record, key)


def load_problems(path: str | Path) -> list[RLPrompt]:
    """Problems for accuracy: prompt + the grader's fields."""

    def parse(record: dict[str, Any]) -> RLPrompt:
        fields = {k: v for k, v in record.items() if k != "prompt"}
        return RLPrompt(_prompt(record), "", fields)

    return read_jsonl(path, parse, "problem")


def load_choice_items(path: str | Path) -> list[ChoiceItem]:
    """Multiple-choice items."""

    def parse(record: dict[str, Any]) -> ChoiceItem:
        key = "prompt" if "prompt" in record else "question"
        choices = record.get("choices")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"field 'choices' must be a list of at least 2 non-empty strings, got {choices!r}")
        if "answer" not in record:
            raise ValueError("field 'answer' (the correct option: a letter or a 0-based index) is missing")
        fields = {k: v for k, v in record.items() if k not in (key, "choices", "answer")}
        return ChoiceItem(_prompt(record, key), choices, parse_answer(record["answer"], len(choices)), fields)

    return read_jsonl(path, parse, "multiple-choice")
