"""Multiple-choice letter extraction: which option (A-D by default) a model's text commits to, or None.

Rules, strongest first; within a rule the LAST match wins (models often discuss options before answering):
    1. \\boxed{B}, \\boxed{(B)}, \\boxed{\\text{B}}
    2. an answer cue: "answer is B", "Answer: (C)", "the correct option is D", "final answer: **A**"
    3. "option C" / "choice (B)"
    4. a commitment verb ending the clause: "I choose B.", "I'd pick (C)!", "it's D" (punctuation or the end
       must follow, so "It is A good idea" is not an answer)
    5. a bold or parenthesised letter: **B**, (C)
    6. the text starts with the letter and a delimiter: "B) 42", "C. Paris", "D:", or is the bare letter
The letter in rules 1-3 may be lower case (it is an explicit answer); elsewhere only upper case counts, so
the article "a" is never read as option A. No rule matching -> None (the grader scores 0).
"""

from __future__ import annotations

import re


def _rules(letters: str) -> list[re.Pattern]:
    L = re.escape(letters)
    lo = re.escape(letters.lower())
    after = r"(?![A-Za-z0-9])"
    return [
        re.compile(rf"\\boxed\{{\s*(?:\\text\{{)?\(?([{L}{lo}])\)?\}}?\s*\}}"),
        re.compile(rf"answer\s*(?:is|:)\s*:?\s*(?:option\s*|choice\s*)?[\(\[]?\**\(?([{L}{lo}]){after}", re.I),
        re.compile(rf"\b(?:option|choice)\s*[\(\[]?([{L}{lo}]){after}", re.I),
        re.compile(rf"\b(?:choose|pick|select|it's|it is|is)\s+\(?\**([{L}])\**\)?(?=\s*(?:[.,!?;]|$))", re.I),
        re.compile(rf"\*\*\(?([{L}])\)?\*\*|\(([{L}])\)"),
        re.compile(rf"^\s*\(?([{L}])(?:\s*[\).:]|\s*$)"),
    ]


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The option letter `text` commits to (module docstring), upper case, or None."""
    for rule in _rules(letters):
        found = None
        for m in rule.finditer(text):
            found = next(g for g in m.groups() if g)
        if found is not None:
            return found.upper()
    return None


def choice_letter(answer: str | int, letters: str = "ABCD") -> str:
    """A reference answer as its letter: "B", "b", "(B)" or the 0-based index 1 -> "B"."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 <= answer < len(letters):
            raise ValueError(f"answer index {answer} is outside the {len(letters)} options {letters}")
        return letters[answer]
    text = str(answer).strip().strip("()").upper()
    if len(text) != 1 or text not in letters:
        raise ValueError(f"reference answer {answer!r} is not one of the option letters {letters} or an index")
    return text


def choice_reward(completion: str, answer: str | int, letters: str = "ABCD") -> float:
    """1.0 when the completion commits to the reference option, else 0.0."""
    return float(extract_choice(completion, letters) == choice_letter(answer, letters))
