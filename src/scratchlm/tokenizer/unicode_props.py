"""Character classes as HF `tokenizers` (Rust) defines them, which differ from Python's str methods.

    whitespace   Unicode White_Space (Rust `char::is_whitespace`; Python's isspace() also takes
                 U+001C..U+001F)
    numeric      general category Nd, Nl or No (Rust `char::is_numeric`; Python's isnumeric() also
                 takes CJK numerals such as "一")
    punctuation  ASCII punctuation (which includes symbols like $ + < = > ^ ` | ~) or category P*
    word         Rust regex `\\w`: Alphabetic, marks, decimal digits, connector punctuation, Join_Control
"""

from __future__ import annotations

import regex

WORD_CLASS = r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]"
# the same classes as single-char regexes (a regex scans a string much faster than a Python loop)
WHITESPACE_CLASS = r"\p{White_Space}"
NUMERIC_CLASS = r"[\p{Nd}\p{Nl}\p{No}]"
PUNCTUATION_CLASS = r"[\p{P}!-/:-@\[-`{-~]"
_WHITE = regex.compile(r"\p{White_Space}")


def is_whitespace(ch: str) -> bool:
    return _WHITE.match(ch) is not None


def count_leading(text, pred) -> int:
    """How many chars at the start of `text` (any iterable of chars) satisfy `pred`."""
    n = 0
    for ch in text:
        if not pred(ch):
            break
        n += 1
    return n
