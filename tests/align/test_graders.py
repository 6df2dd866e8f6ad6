"""Verifiable graders on hand-written cases (each with near-misses): math answers, the <think>/<answer>
format, multiple-choice letters; and their registration as named rewards."""

from __future__ import annotations

import pytest

from scratchlm.align.graders import (choice_letter, extract_choice, extract_math_answer, format_reward, math_equal,
                                     think_answer)
from scratchlm.align.rewards import get_reward

# (model text, reference answer, correct?)
MATH_CASES = [
    ("So the total is \\boxed{42}.", "42", True),
    ("So the total is \\boxed{42}.", "43", False),
    ("First \\boxed{3}, corrected: \\boxed{5}", "5", True),  # the LAST box
    ("First \\boxed{3}, corrected: \\boxed{5}", "3", False),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),  # nested braces
    ("\\boxed{\\dfrac{3}{4}}", "3/4", True),
    ("\\boxed{\\frac{3}{4}}", "4/3", False),
    ("\\boxed{-\\frac{2}{3}}", "-2/3", True),
    ("\\boxed{-\\frac{2}{3}}", "2/3", False),
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", True),
    ("#### 1,234", "1234", True),
    ("#### 1,234", "1234.5", False),
    ("#### 1,23", "123", False),  # not a thousands separator: not the number 123
    ("The answer is 7.", "7", True),
    ("The answer is 7.", "17", False),
    ("The answer is 3.5.", "7/2", True),
    ("The final answer is: -12", "-12", True),
    ("The final answer is: -12", "12", False),
    ("Answer: $18", "18", True),
    ("The answer is 18 dollars.", "18", True),
    ("The answer is 18 dollars.", "180", False),
    ("The answer is 25%.", "25", True),
    ("The answer is 25%.", "0.25", True),
    ("The answer is 25%.", "2.5", False),
    ("The answer is 0.50", "1/2", True),
    ("The answer is 0.333", "1/3", False),  # no tolerance: 0.333 is not 1/3
    ("The answer is \\text{Paris}.", "paris", True),
    ("The answer is Paris.", "London", False),
    ("<think>2+3</think> <answer>5</answer>", "5", True),
    ("<think>2+3</think> <answer>6</answer>", "5", False),
    ("I computed 12 then 123", "123", True),  # fallback: the last number
    ("I computed 123 then 12", "123", False),  # 12 is not 123 (no substring match)
    ("The result is −4", "-4", True),  # Unicode minus
    ("x = 1e3", "1000", True),
    ("I don't know.", "0", False),  # nothing to extract
    ("The answer is x + 1", "x+1", True),  # spaces do not matter in expressions
    ("The answer is x + 1", "x+2", False),
]


@pytest.mark.parametrize("text,reference,correct", MATH_CASES)
def test_math_grader(text, reference, correct):
    assert math_equal(extract_math_answer(text), reference) is correct
    assert get_reward("math")(text, {"answer": reference}) == float(correct)


def test_math_extraction_rules():
    assert extract_math_answer("so \\boxed{\\frac{1}{2}} and #### 9") == "\\frac{1}{2}"  # box beats ####
    assert extract_math_answer("#### 9\nThe answer is 8") == "9"  # #### beats "the answer is"
    assert extract_math_answer("no numbers here") is None
    assert extract_math_answer("costs 5 dollars", fallback_last_number=False) is None
    assert extract_math_answer("\\boxed{unbalanced", fallback_last_number=False) is None
    assert math_equal(None, "1") is False


FORMAT_CASES = [
    ("<think>3 + 4 = 7</think> <answer>7</answer>", True),
    ("3 + 4 = 7</think> <answer>7</answer>", True),  # the prompt ended with <think>
    ("<think>3 + 4 = 7</think>\n<answer>7</answer>", True),
    ("  <think>a</think><answer>7</answer>\n", True),
    ("<think>multi\nline\nreasoning</think> <answer>x = 2</answer>", True),
    ("<think>a</think> <answer>7</answer> extra", False),  # text after </answer>
    ("<think>a</think> <answer></answer>", False),  # empty answer
    ("<think> </think> <answer>7</answer>", False),  # empty thinking
    ("<think>a</think>", False),
    ("<answer>7</answer>", False),
    ("<think>a <answer>7</answer>", False),  # no </think>
    ("<think>a</think> <answer>7", False),  # no </answer>
    ("<think>a</think> <think>b</think> <answer>7</answer>", False),  # two thinking blocks
    ("<think>a</think> <answer>7</answer><answer>8</answer>", False),
    ("<answer>7</answer> <think>a</think>", False),  # wrong order
    ("<think><think>a</think> <answer>7</answer>", False),
    ("The answer is 7", False),
    ("", False),
    ("<think>a</think> junk <answer>7</answer>", False),  # text between the blocks
    ("<Think>a</Think> <Answer>7</Answer>", False),  # tags are case-sensitive
    ("<think>a</think> < answer>7</answer>", False),
    ("<think>a</think> <answer>7</answer >", False),
    ("<think>a</think><answer> 7 </answer>", True),
    ("<think>\n</think> <answer>7</answer>", False),
    ("<think>a</think> <answer>\\boxed{7}</answer>", True),
    ("prefix <think>a</think> <answer>7</answer>", False),  # text before <think>
    ("<think>a</think>\n\n<answer>7</answer>", True),
    ("<think>a</think> <answer>7</answer>.", False),
    ("</think> <answer>7</answer>", False),  # no thinking at all
    ("<think>a</think> <answer>seven</answer>", True),  # the format does not judge the answer
]


@pytest.mark.parametrize("text,well_formed", FORMAT_CASES)
def test_think_format(text, well_formed):
    assert format_reward(text) == float(well_formed)
    assert get_reward("think_format")(text, {}) == float(well_formed)


def test_think_math_needs_format_and_answer():
    r = get_reward("think_math")
    assert r("<think>5+2</think> <answer>7</answer>", {"answer": "7"}) == 1.0
    assert r("<think>5+2</think> <answer>\\boxed{7}</answer>", {"answer": "7"}) == 1.0
    assert r("<think>5+2</think> <answer>8</answer>", {"answer": "7"}) == 0.0
    assert r("The answer is 7", {"answer": "7"}) == 0.0  # right answer, wrong format
    assert think_answer("<think>a</think> <answer> 7 </answer>") == "7"


CHOICE_CASES = [
    ("The answer is B.", "B"),
    ("the answer is (c)", "C"),
    ("Answer: D", "D"),
    ("Final answer: **A**", "A"),
    ("A is tempting, but the answer is C.", "C"),
    ("The answer is B. Wait, no: the answer is D.", "D"),  # the last statement wins
    ("\\boxed{B}", "B"),
    ("\\boxed{(C)}", "C"),
    ("\\boxed{\\text{A}}", "A"),
    ("I choose B.", "B"),
    ("I'd pick (C)!", "C"),
    ("Looking at it, it's D", "D"),
    ("Option C is correct because ...", "C"),
    ("The correct choice is (B) since 2+2=4", "B"),
    ("**B**", "B"),
    ("(A)", "A"),
    ("B) 42", "B"),
    ("C. Paris", "C"),
    ("D", "D"),
    ("  a", None),  # a lone lower-case letter is not an answer
    ("A cat is an animal.", None),  # the article
    ("It is A good idea to think.", None),
    ("I am not sure.", None),
    ("None of the options is right.", None),
    ("The answer is E.", None),  # outside A-D
    ("The answer is because of gravity.", None),  # 'b' followed by more letters
    ("", None),
    ("Both A and B look wrong to me, so", None),
    ("The answer is 42.", None),
    ("Answer: Paris", None),
    ("Between options, option b is best", "B"),
    ("After elimination, the answer: (A)", "A"),
]


@pytest.mark.parametrize("text,letter", CHOICE_CASES)
def test_multiple_choice_extraction(text, letter):
    assert extract_choice(text) == letter
    if letter is not None:
        assert get_reward("multiple_choice")(text, {"answer": letter}) == 1.0
        other = "A" if letter != "A" else "B"
        assert get_reward("multiple_choice")(text, {"answer": other}) == 0.0


def test_choice_letters_and_errors():
    assert choice_letter(1) == "B" and choice_letter("(c)") == "C" and choice_letter("D") == "D"
    assert extract_choice("The answer is E.", letters="ABCDE") == "E"
    with pytest.raises(ValueError, match="option letters"):
        choice_letter("Z")
    with pytest.raises(ValueError, match="outside"):
        choice_letter(7)
    with pytest.raises(ValueError, match="needs the field 'answer'"):
        get_reward("multiple_choice")("B", {})
