"""Pre-tokenizers: cut normalized text into pre-tokens; BPE never merges across a cut.

    Split(pattern, behavior, invert)  cut at literal/regex matches (behaviours in splitting.py);
                                      Llama-3 and Qwen2 use one with their own regex
    Digits(individual_digits)         digits apart from the rest; each digit alone, or digit runs together
    Punctuation(behavior)             cut at punctuation chars
    Whitespace                        words \\w+ and symbol runs [^\\w\\s]+, whitespace dropped
    WhitespaceSplit                   cut at whitespace, whitespace dropped
    CharDelimiterSplit(delimiter)     cut at one char, the char dropped
    ByteLevel, Metaspace              in byte_level.py / metaspace.py (they also rewrite the text)
    Sequence([...])                   apply in order, each on the pieces of the previous one
"""

from __future__ import annotations

from functools import lru_cache

import regex

from scratchlm.tokenizer.byte_level import ByteLevel
from scratchlm.tokenizer.json_fields import check_fields, dispatch
from scratchlm.tokenizer.metaspace import Metaspace
from scratchlm.tokenizer.normalized import text_of
from scratchlm.tokenizer.split_delimiters import char_regex, check_behavior, compile_pattern, parse_pattern, regex_runs, split_text
from scratchlm.tokenizer.unicode_props import NUMERIC_CLASS, PUNCTUATION_CLASS, WHITESPACE_CLASS, WORD_CLASS


class Split:
    """Cut at every match of a literal or regex `pattern` with a delimiter `behavior`."""

    def __init__(self, pattern: str, behavior: str = "Isolated", invert: bool = False, literal: bool = False) -> None:
        self.pattern, self.behavior, self.invert, self.literal = pattern, behavior, invert, literal
        self.rx = compile_pattern(pattern, literal)

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Split":
        check_fields(d, where, ("pattern", "behavior", "invert"))
        pattern, literal = parse_pattern(d["pattern"], where)
        return cls(pattern, check_behavior(d["behavior"], where), bool(d["invert"]), literal)

    def to_json(self) -> dict:
        return {"type": "Split", "pattern": {"String" if self.literal else "Regex": self.pattern},
                "behavior": self.behavior, "invert": self.invert}

    def pre_tokenize(self, pieces: list) -> list:
        return [p for nt in pieces for p in split_text(nt, regex_runs(self.rx, text_of(nt)), self.behavior, self.invert)]


class _CharSplit:
    """Base of the pre-tokenizers that cut at single chars of a class (`char_class`, a regex class)."""

    behavior = "Isolated"
    char_class = ""
    oniguruma = True  # chars newer than Oniguruma's tables are unassigned (False: the class decides)

    def pre_tokenize(self, pieces: list) -> list:
        rx = char_regex(self.char_class)
        return [p for nt in pieces for p in split_text(nt, regex_runs(rx, text_of(nt), self.oniguruma), self.behavior)]



class Digits(_CharSplit):
    """Numeric chars (Nd/Nl/No) apart: each alone (individual_digits) or as contiguous runs."""

    char_class = NUMERIC_CLASS
    oniguruma = False  # HF asks Rust's char::is_numeric, whose tables are newer than Oniguruma's

    def __init__(self, individual_digits: bool = False) -> None:
        self.individual_digits = individual_digits
        self.behavior = "Isolated" if individual_digits else "Contiguous"

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Digits":
        check_fields(d, where, optional=("individual_digits",))
        return cls(bool(d.get("individual_digits", False)))

    def to_json(self) -> dict:
        return {"type": "Digits", "individual_digits": self.individual_digits}


class Punctuation(_CharSplit):
    """Cut at punctuation (ASCII punctuation or Unicode P*) with a delimiter behaviour."""

    char_class = PUNCTUATION_CLASS

    def __init__(self, behavior: str = "Isolated") -> None:
        self.behavior = behavior

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Punctuation":
        check_fields(d, where, optional=("behavior",))
        return cls(check_behavior(d.get("behavior", "Isolated"), where))

    def to_json(self) -> dict:
        return {"type": "Punctuation", "behavior": self.behavior}


class WhitespaceSplit(_CharSplit):
    """Cut at White_Space chars, which are dropped."""

    char_class = WHITESPACE_CLASS
    behavior = "Removed"

    @classmethod
    def from_json(cls, d: dict, where: str) -> "WhitespaceSplit":
        check_fields(d, where)
        return cls()

    def to_json(self) -> dict:
        return {"type": "WhitespaceSplit"}


class CharDelimiterSplit(_CharSplit):
    """Cut at one delimiter char, which is dropped."""

    behavior = "Removed"

    def __init__(self, delimiter: str) -> None:
        self.delimiter = delimiter
        self.char_class = regex.escape(delimiter)

    @classmethod
    def from_json(cls, d: dict, where: str) -> "CharDelimiterSplit":
        check_fields(d, where, ("delimiter",))
        return cls(d["delimiter"])

    def to_json(self) -> dict:
        return {"type": "CharDelimiterSplit", "delimiter": self.delimiter}


@lru_cache(maxsize=1)
def _word_or_symbols() -> regex.Pattern:
    return regex.compile(rf"{WORD_CLASS}+|[^\p{{Alphabetic}}\p{{M}}\p{{Nd}}\p{{Pc}}\p{{Join_Control}}\p{{White_Space}}]+")


class Whitespace:
    """Keep runs of word chars and runs of other non-space chars; drop whitespace."""

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Whitespace":
        check_fields(d, where)
        return cls()

    def to_json(self) -> dict:
        return {"type": "Whitespace"}

    def pre_tokenize(self, pieces: list) -> list:
        rx = _word_or_symbols()
        return [p for nt in pieces for p in split_text(nt, regex_runs(rx, text_of(nt)), "Removed", invert=True)]


class Sequence:
    """Pre-tokenizers applied in order."""

    def __init__(self, pretokenizers: list) -> None:
        self.pretokenizers = pretokenizers

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Sequence":
        check_fields(d, where, ("pretokenizers",))
        return cls([from_json(p, f"{where}.pretokenizers[{i}]") for i, p in enumerate(d["pretokenizers"])])

    def to_json(self) -> dict:
        return {"type": "Sequence", "pretokenizers": [p.to_json() for p in self.pretokenizers]}

    def pre_tokenize(self, pieces: list) -> list:
        for p in self.pretokenizers:
            pieces = p.pre_tokenize(pieces)
        return pieces


PRE_TOKENIZERS = {"Split": Split, "Digits": Digits, "Punctuation": Punctuation, "Whitespace": Whitespace,
                  "WhitespaceSplit": WhitespaceSplit, "CharDelimiterSplit": CharDelimiterSplit,
                  "ByteLevel": ByteLevel, "Metaspace": Metaspace, "Sequence": Sequence}


def from_json(d: dict | None, where: str = "pre_tokenizer"):
    """A pre-tokenizer from its tokenizer.json object (None stays None)."""
    return None if d is None else dispatch(d, where, PRE_TOKENIZERS)


def needs_positions(pre_tokenizer) -> bool:
    """True if some stage must know where a piece sits in the input (Metaspace prepend_scheme "first"):
    pieces are then NormalizedText, not plain strings."""
    if isinstance(pre_tokenizer, Sequence):
        return any(needs_positions(p) for p in pre_tokenizer.pretokenizers)
    return isinstance(pre_tokenizer, Metaspace) and pre_tokenizer.needs_positions
