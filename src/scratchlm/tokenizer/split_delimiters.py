"""Cutting text at pattern matches, with HF's five delimiter behaviours (used by every pre-tokenizer).

A pattern yields a cover of the text by alternating runs: (span, is_match). Then, for matches M and
the text between them T:
    Isolated            T | M | T          every run is its own piece
    Removed             T |   | T          matches are dropped
    MergedWithPrevious  T+M | T+M          a match joins the piece before it
    MergedWithNext      T | M+T | M+T      a match joins the piece after it
    Contiguous          runs of the same kind are fused: "a12b3" with digits -> a | 12 | b | 3
`invert=True` swaps match and non-match first. Empty pieces are dropped.

Regexes behave like Oniguruma's (HF's engine, Ruby syntax): `^`/`$` match at every line start/end, and
an empty match right where the previous match ended is skipped (the search moves on one char), and
chars newer than Oniguruma's Unicode tables are unassigned to it (unicode_props.as_regex_engines_see).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import regex

from scratchlm.tokenizer.normalized import NormalizedText
from scratchlm.tokenizer.unicode_props import NEWER_THAN_ONIG, as_regex_engines_see

BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")
Run = tuple[int, int, bool]  # (start, end, is_match) in chars


@lru_cache(maxsize=64)
def compile_pattern(pattern: str, literal: bool) -> regex.Pattern:
    """A tokenizer.json pattern ({"String": s} -> literal, {"Regex": r}) as a Python regex."""
    try:
        return regex.compile(regex.escape(pattern) if literal else pattern, regex.MULTILINE)
    except regex.error as exc:
        raise ValueError(f"tokenizer.json regex {pattern!r} does not compile: {exc}") from None


def parse_pattern(spec: object, where: str) -> tuple[str, bool]:
    """{"String": s} -> (s, True); {"Regex": r} -> (r, False); anything else is a clear error."""
    if isinstance(spec, dict) and len(spec) == 1:
        (kind, value), = spec.items()
        if kind in ("String", "Regex") and isinstance(value, str):
            return value, kind == "String"
    raise ValueError(f"{where}: pattern {spec!r} must be {{'String': ...}} or {{'Regex': ...}}")


def onig_matches(rx: regex.Pattern, text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of successive matches, skipping an empty match where the last match ended."""
    pos, last_end, n = 0, -1, len(text)
    while pos <= n:
        m = rx.search(text, pos)
        if m is None:
            return
        s, e = m.span()
        if s == e and e == last_end:
            pos = e + 1
            continue
        yield s, e
        pos = last_end = e


@lru_cache(maxsize=64)
def _names_newer_chars(rx: regex.Pattern) -> bool:
    return NEWER_THAN_ONIG.search(rx.pattern) is not None


def regex_spans(rx: regex.Pattern, text: str, oniguruma: bool = True) -> list[tuple[int, int]]:
    """(start, end) of rx's matches in `text` as Oniguruma finds them (its Unicode tables: a char it
    does not know is unassigned, unless the pattern names that char itself); oniguruma=False: as the
    `regex` module finds them (char classes that HF computes in Rust, not with a regex)."""
    return [m.span() for m in rx.finditer(_as_seen(rx, text) if oniguruma else text)]


def _as_seen(rx: regex.Pattern, text: str) -> str:
    """The text rx runs on: chars newer than Oniguruma's tables unassigned (unless rx names one)."""
    if text.isascii() or NEWER_THAN_ONIG.search(text) is None or _names_newer_chars(rx):
        return text
    return as_regex_engines_see(text)


def regex_pieces(rx: regex.Pattern, text: str) -> list[str]:
    """The matched substrings of `text` (for patterns that never match empty, like GPT-2's)."""
    seen = _as_seen(rx, text)
    if seen is text:
        return rx.findall(text)
    return [text[m.start():m.end()] for m in rx.finditer(seen)]


def regex_runs(rx: regex.Pattern, text: str, oniguruma: bool = True) -> list[Run]:
    """Cover of `text` by match / non-match runs (Oniguruma iteration, see module docstring)."""
    if not text:
        return [(0, 0, False)]
    spans = regex_spans(rx, text, oniguruma)
    if any(s == e for s, e in spans):  # Python and Oniguruma differ only around empty matches
        spans = list(onig_matches(rx, _as_seen(rx, text) if oniguruma else text))
    runs: list[Run] = []
    prev = 0
    for s, e in spans:
        if s > prev:
            runs.append((prev, s, False))
        runs.append((s, e, True))
        prev = e
    if prev < len(text):
        runs.append((prev, len(text), False))
    return runs


@lru_cache(maxsize=32)
def char_regex(char_class: str) -> regex.Pattern:
    """A regex matching one char of a class (pre-tokenizers that cut at single chars)."""
    return regex.compile(char_class)


def _merge_runs(runs: list[Run], behavior: str) -> list[tuple[int, int]]:
    """Apply a delimiter behaviour to runs; returns the kept (start, end) pieces."""
    if behavior == "Isolated":
        return [(s, e) for s, e, _ in runs]
    if behavior == "Removed":
        return [(s, e) for s, e, m in runs if not m]
    out: list[list[int]] = []
    if behavior == "MergedWithNext":
        runs = runs[::-1]
    previous = False
    for s, e, m in runs:
        if behavior == "Contiguous":
            join = m == previous and bool(out)
        else:
            join = m and not previous and bool(out)
        if join and behavior == "MergedWithNext":
            out[-1][0] = s
        elif join:
            out[-1][1] = e
        else:
            out.append([s, e])
        previous = m
    if behavior == "MergedWithNext":
        out.reverse()
    return [(s, e) for s, e in out]


def split_text(nt: str | NormalizedText, runs: list[Run], behavior: str, invert: bool = False) -> list:
    """Cut `nt` (str or NormalizedText) by `runs` with a delimiter behaviour; empty pieces are dropped."""
    if invert:
        runs = [(s, e, not m) for s, e, m in runs]
    if isinstance(nt, str):
        return [nt[s:e] for s, e in _merge_runs(runs, behavior) if e > s]
    return [nt.slice(s, e) for s, e in _merge_runs(runs, behavior) if e > s]


def check_behavior(behavior: object, where: str) -> str:
    """The behaviour name in HF's CamelCase (tokenizer.json may also write it in snake_case)."""
    names = {b.lower(): b for b in BEHAVIORS} | {"merged_with_previous": "MergedWithPrevious", "merged_with_next": "MergedWithNext"}
    if isinstance(behavior, str) and behavior.lower() in names:
        return names[behavior.lower()]
    raise ValueError(f"{where}: behavior {behavior!r} is not one of {list(BEHAVIORS)}")
