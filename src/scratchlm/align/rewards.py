"""Named verifiable reward functions: reward(completion_text, fields) -> float.

`fields` is the RL prompt record without "prompt"/"reward" (e.g. {"answer": "7"}). The completion text
is decoded without its end token.
    exact_match    1 if completion.strip() == answer.strip() else 0
    numeric_match  1 if the LAST number in the completion equals float(answer) (|diff| <= 1e-6) else 0
    contains       1 if answer occurs in the completion else 0
    regex_match    1 if re.fullmatch(pattern, completion.strip()) else 0
    plus_minus     exact_match mapped to +1 / -1 (DAPO's rule-based reward)
    math           1 if the extracted final answer (\\boxed{}, ####, "the answer is", <answer>, last number)
                   equals `answer` as math (graders/math_answer.py: fractions, decimals, %, commas...)
    think_format   1 if the completion is `<think>...</think> <answer>...</answer>` (graders/think_format.py)
    think_math     1 if well formed AND the <answer> content equals `answer` as math (R1-Zero's reward)
    multiple_choice 1 if the option letter the completion commits to is `answer` ("B" or an index)
"""

from __future__ import annotations

import re
from typing import Any, Callable

from scratchlm.align.graders import choice_reward, extract_math_answer, format_reward, math_equal, think_answer

RewardFn = Callable[[str, dict[str, Any]], float]
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _field(fields: dict[str, Any], key: str, reward: str) -> str:
    if key not in fields:
        raise ValueError(f"reward {reward!r} needs the field {key!r} on each prompt line, got fields {sorted(fields)}")
    return str(fields[key])


def exact_match(completion: str, fields: dict[str, Any]) -> float:
    return float(completion.strip() == _field(fields, "answer", "exact_match").strip())


def numeric_match(completion: str, fields: dict[str, Any]) -> float:
    answer = float(_field(fields, "answer", "numeric_match"))
    numbers = NUMBER.findall(completion)
    return float(bool(numbers) and abs(float(numbers[-1]) - answer) <= 1e-6)


def contains(completion: str, fields: dict[str, Any]) -> float:
    return float(_field(fields, "answer", "contains") in completion)


def regex_match(completion: str, fields: dict[str, Any]) -> float:
    return float(re.fullmatch(_field(fields, "pattern", "regex_match"), completion.strip()) is not None)


def plus_minus(completion: str, fields: dict[str, Any]) -> float:
    return 2.0 * exact_match(completion, fields) - 1.0


def math(completion: str, fields: dict[str, Any]) -> float:
    return float(math_equal(extract_math_answer(completion), _field(fields, "answer", "math")))


def think_format(completion: str, fields: dict[str, Any]) -> float:
    return format_reward(completion)


def think_math(completion: str, fields: dict[str, Any]) -> float:
    answer = _field(fields, "answer", "think_math")
    inner = think_answer(completion)
    return float(inner is not None and math_equal(extract_math_answer(inner), answer))


def multiple_choice(completion: str, fields: dict[str, Any]) -> float:
    if "answer" not in fields:
        raise ValueError(f"reward 'multiple_choice' needs the field 'answer' on each prompt line, got fields "
                         f"{sorted(fields)}")
    return choice_reward(completion, fields["answer"])


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "numeric_match": numeric_match,
    "contains": contains,
    "regex_match": regex_match,
    "plus_minus": plus_minus,
    "math": math,
    "think_format": think_format,
    "think_math": think_math,
    "multiple_choice": multiple_choice,
}


def get_reward(name: str) -> RewardFn:
    """The reward function called `name`, or a ValueError listing the valid names."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward function {name!r}; valid: {sorted(REWARDS)}")
    return REWARDS[name]
