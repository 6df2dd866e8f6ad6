"""Verifiable graders: math final answers, the <think>/<answer> format, multiple-choice letters."""

from scratchlm.align.graders.math_answer import extract_math_answer, math_equal, math_reward
from scratchlm.align.graders.multiple_choice import choice_letter, choice_reward, extract_choice
from scratchlm.align.graders.think_format import format_reward, think_answer

__all__ = ["extract_math_answer", "math_equal", "math_reward", "extract_choice", "choice_letter", "choice_reward",
           "format_reward", "think_answer"]
