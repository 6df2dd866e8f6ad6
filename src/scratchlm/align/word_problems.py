"""Locally generated arithmetic word problems with worked solutions, for the reasoning-RL demo.

A problem adds two numbers a, b in [10, 99], told as a short story ("Ann has 47 marbles and gets 38
more. How many now?"). The worked solution restates the sum, then adds digit by digit:
    a+b:    the two numbers copied from the story
    units:  a0 + b0 = u          (with ", carry 1" when u >= 10)
    tens:   a1 + b1 (+ 1) = t    the answer is t followed by the last digit of u
in two surface forms: `plain` text for pretraining ("47+38: 7+8=15, carry 1. 4+3+1=8. The answer is 85.")
and the reasoning format for SFT and RL ("<think>47+38: 7+8=15, carry 1. 4+3+1=8.</think> <answer>85</answer>").
A `slip` solution makes the classic mistake of dropping the carry ("7+8=15. 4+3=7." -> 75): the
demo's human-written data makes it in a fixed share of the carry problems, so a model that imitates
the data learns the slip, and only a verifiable reward can tell it apart.
Splits are by (a, b) pair: held-out pairs never appear in any training text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jin", "Kai", "Lea")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "shells", "cards", "pens", "stamps", "beads")
TEMPLATES = (
    "{n} has {a} {i} and gets {b} more. How many now?",
    "A box has {a} {i}, another has {b}. How many in all?",
    "{n} found {a} {i}, then {b} more. How many in total?",
    "{a} {i} are on a shelf; {n} adds {b}. How many now?",
)


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    question: str

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def carries(self) -> bool:
        return self.a % 10 + self.b % 10 >= 10


def steps(a: int, b: int, slip: bool = False) -> tuple[str, int]:
    """(the digit-by-digit working, its final answer); slip drops the carry of a carry problem."""
    u = a % 10 + b % 10
    if u >= 10 and not slip:
        t = a // 10 + b // 10 + 1
        working = f"{a}+{b}: {a % 10}+{b % 10}={u}, carry 1. {a // 10}+{b // 10}+1={t}."
    else:
        t = a // 10 + b // 10
        working = f"{a}+{b}: {a % 10}+{b % 10}={u}. {a // 10}+{b // 10}={t}."
    return working, int(f"{t}{u % 10}")


def plain_solution(p: Problem, slip: bool = False) -> str:
    working, answer = steps(p.a, p.b, slip)
    return f"{working} The answer is {answer}."


def reasoning_solution(p: Problem, slip: bool = False) -> str:
    working, answer = steps(p.a, p.b, slip)
    return f"<think>{working}</think> <answer>{answer}</answer>"


def make_problem(a: int, b: int, rng: random.Random) -> Problem:
    template = rng.choice(TEMPLATES)
    return Problem(a, b, template.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b))


def split_pairs(n_test: int, seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training pairs, held-out pairs): every (a, b) in [10, 99]^2, shuffled, the last n_test held out."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    return pairs[:-n_test], pairs[-n_test:]


def sample_problems(pairs: list[tuple[int, int]], n: int, rng: random.Random) -> list[Problem]:
    return [make_problem(*rng.choice(pairs), rng) for _ in range(n)]
