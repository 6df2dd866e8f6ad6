"""Math final answers: extraction from a model's text and equivalence with a reference answer.

Extraction (`extract_math_answer`), the first rule that finds something wins:
    1. the last \\boxed{...} or \\fbox{...} (nested braces balanced)          "... so \\boxed{\\frac{1}{2}}"
    2. the last "#### X" (GSM8K's answer line), X up to the end of the line    "#### 1,234"
    3. the last "the (final) answer is X" / "answer: X", X up to the end of the sentence
    4. the last <answer>X</answer>
    5. (fallback_last_number=True) the last number in the text
None when nothing is found (the grader then scores 0).

Equivalence (`math_equal`): both sides are normalised (strip $, \\( \\), \\text{}, \\left/\\right, spaces,
a trailing period; \\dfrac/\\tfrac -> \\frac; the Unicode minus -> "-"). If both parse as numbers they are
compared EXACTLY as fractions: integers, decimals, thousands separators ("1,234"; "1,23" is not a
number), signs, a/b and \\frac{a}{b} (also -\\frac{a}{b}), scientific notation. A percentage p% equals p
or p/100 ("25%" = "25" = "0.25"). A number followed by a unit word ("18 dollars") is that number.
Otherwise the normalised strings must be equal (case-insensitive), so "x+1" = "x + 1" but "1/3" !=
"0.333". Nothing is evaluated symbolically: equal expressions written differently are not equal.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LAST_NUMBER_RE = re.compile(
    r"[-+−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?%?")
_ANSWER_IS_RE = re.compile(r"(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
_HASH_RE = re.compile(r"####\s*([^\n]+)")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FRAC_RE = re.compile(r"^([-+]?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_FRAC_SHORT_RE = re.compile(r"^([-+]?)\\frac(\d)(\d)$")
_UNIT_RE = re.compile(r"^([-+−]?[\d,./]+%?)\s+[a-zA-Z][a-zA-Z .]*$")


def _balanced(text: str, start: int) -> str | None:
    """The content of the {...} group opening at text[start] ('{'), or None when unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1: i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...}, or None."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        content = _balanced(text, m.end() - 1)
        if content is not None:
            best = content
    return best


def _sentence(text: str) -> str:
    """Text up to the end of its first sentence: a newline, or a period not inside a number."""
    line = text.split("\n", 1)[0]
    m = re.search(r"\.(?!\d)", line)
    return (line[: m.start()] if m else line).strip()


def extract_math_answer(text: str, fallback_last_number: bool = True) -> str | None:
    """The final answer in `text` as a string (module docstring), or None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASH_RE.findall(text)
    if hashes:
        return hashes[-1].strip()
    said = _ANSWER_IS_RE.findall(text)
    if said:
        answer = _sentence(said[-1])
        if answer:
            inner = last_boxed(answer)
            return inner.strip() if inner is not None else answer
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        inner = last_boxed(tags[-1])
        return (inner if inner is not None else tags[-1]).strip()
    if fallback_last_number:
        numbers = _LAST_NUMBER_RE.findall(text)
        if numbers:
            return numbers[-1].strip()
    return None


def normalize_answer(text: str) -> str:
    """The canonical string form used for comparison (module docstring)."""
    s = text.strip().replace("−", "-").replace("–", "-")
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|mathbf|textbf)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "").replace("$", "")
    s = s.strip().rstrip(".").strip()
    inner = last_boxed(s) if s.startswith(("\\boxed", "\\fbox")) else None
    if inner is not None:
        return normalize_answer(inner)
    return re.sub(r"\s+", "", s)


def parse_number(text: str) -> tuple[Fraction, bool] | None:
    """(value, is_percentage) of a normalised answer, or None when it is not a number."""
    s = normalize_answer(text)
    percent = s.endswith("%")
    s = s[:-1] if percent else s
    frac = _FRAC_RE.match(s) or _FRAC_SHORT_RE.match(s)
    if frac:
        num, den = parse_number(frac.group(2)), parse_number(frac.group(3))
        if num is None or den is None or den[0] == 0:
            return None
        value = num[0] / den[0]
        return (-value if frac.group(1) == "-" else value), percent
    if s.count("/") == 1:
        a, b = (parse_number(part) for part in s.split("/"))
        if a is None or b is None or b[0] == 0 or a[1] or b[1]:
            return None
        return a[0] / b[0], percent
    if not s or _NUMBER_RE.fullmatch(s) is None or not any(c.isdigit() for c in s):
        return None
    try:
        return Fraction(s.replace(",", "")), percent
    except (ValueError, ZeroDivisionError):
        return None


def _number_or_unit(text: str) -> tuple[Fraction, bool] | None:
    """parse_number, also reading "18 dollars" as 18 (a number, a space, then unit words)."""
    parsed = parse_number(text)
    if parsed is not None:
        return parsed
    plain = re.sub(r"\\text\{([^{}]*)\}", r"\1", text.replace("$", "")).strip().rstrip(".")
    m = _UNIT_RE.match(plain)
    return parse_number(m.group(1)) if m else None


def _candidates(value: tuple[Fraction, bool]) -> set[Fraction]:
    number, percent = value
    return {number, number / 100} if percent else {number}


def math_equal(prediction: str | None, reference: str) -> bool:
    """True when the predicted answer equals the reference (module docstring)."""
    if prediction is None:
        return False
    pred, ref = _number_or_unit(prediction), _number_or_unit(reference)
    if pred is not None and ref is not None:
        if pred[1] or ref[1]:  # a percentage on either side: p% = p = p / 100
            return bool(({pred[0]} | _candidates(pred)) & ({ref[0]} | _candidates(ref)))
        return pred[0] == ref[0]
    if pred is not None or ref is not None:
        return False
    return normalize_answer(prediction).lower() == normalize_answer(reference).lower()


def math_reward(completion: str, answer: str, fallback_last_number: bool = True) -> float:
    """1.0 when the completion's extracted final answer equals `answer`, else 0.0."""
    return float(math_equal(extract_math_answer(completion, fallback_last_number), answer))
