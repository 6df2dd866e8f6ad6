"""Normalizers: the first pipeline stage, rewriting text before it is cut into pre-tokens.

    NFC / NFD / NFKC / NFKD   Unicode normalization forms (unicodedata.normalize)
    Lowercase                 every char lowercased on its own (no final-sigma rule, as in Rust)
    Replace(pattern, content) every match of a literal or regex -> content
    Prepend(prepend)          prepend a string to a non-empty text
    Strip(left, right)        drop leading / trailing White_Space
    Sequence([...])           apply in order
Each keeps the input span of every output char (see normalized.py); a rewrite that changes the length
maps each new char to the input chars it came from.
"""

from __future__ import annotations

import unicodedata

from scratchlm.tokenizer.json_fields import check_fields, dispatch
from scratchlm.tokenizer.normalized import NormalizedText
from scratchlm.tokenizer.split_delimiters import compile_pattern, parse_pattern, regex_runs
from scratchlm.tokenizer.unicode_forms import normalize_aligned
from scratchlm.tokenizer.unicode_props import NEWER_LOWERCASE, NEWER_UPPERCASE, count_leading, is_whitespace


class Unicode:
    """NFC, NFD, NFKC or NFKD, each output char aligned to input chars as HF aligns them
    (unicode_forms.py): composed "é" from "e\u0301" points at "e", both chars of a decomposed "é" at "é"."""

    def __init__(self, form: str) -> None:
        self.form = form

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Unicode":
        check_fields(d, where)
        return cls(d["type"])

    def to_json(self) -> dict:
        return {"type": self.form}

    def normalize(self, nt: NormalizedText) -> NormalizedText:
        if unicodedata.is_normalized(self.form, nt.text):
            return nt
        return nt.rewritten(*normalize_aligned(nt.text, self.form, nt.all_spans()))


class Lowercase:
    """Per-char lowercase (Rust's char::to_lowercase, which has no final-sigma context rule, and knows
    case pairs newer than Python's: unicode_props.NEWER_LOWERCASE)."""

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Lowercase":
        check_fields(d, where)
        return cls()

    def to_json(self) -> dict:
        return {"type": "Lowercase"}

    def normalize(self, nt: NormalizedText) -> NormalizedText:
        text = nt.text
        low = text.lower() if "Σ" not in text else "".join(c.lower() for c in text)
        newer = not text.isascii() and NEWER_UPPERCASE.search(text) is not None
        if len(low) == len(text):
            return nt.replaced(low.translate(NEWER_LOWERCASE) if newer else low)
        spans = nt.all_spans()
        out, new = [], []
        for ch, sp in zip(text, spans):
            lc = ch.translate(NEWER_LOWERCASE) if newer and NEWER_UPPERCASE.match(ch) else ch.lower()
            out.append(lc)
            new.extend([sp] * len(lc))
        return nt.rewritten("".join(out), new)


class Replace:
    """Every match of `pattern` (a literal or a regex) becomes `content`; also a decoder."""

    def __init__(self, pattern: str, content: str, literal: bool = True) -> None:
        self.pattern, self.content, self.literal = pattern, content, literal
        self.rx = compile_pattern(pattern, literal)

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Replace":
        check_fields(d, where, ("pattern", "content"))
        pattern, literal = parse_pattern(d["pattern"], where)
        return cls(pattern, d["content"], literal)

    def to_json(self) -> dict:
        return {"type": "Replace", "pattern": {"String" if self.literal else "Regex": self.pattern},
                "content": self.content}

    def _replace(self, text: str) -> str:
        return "".join(self.content if m else text[s:e] for s, e, m in regex_runs(self.rx, text))

    def normalize(self, nt: NormalizedText) -> NormalizedText:
        runs = regex_runs(self.rx, nt.text)
        if not any(m for _, _, m in runs):
            return nt
        text = "".join(self.content if m else nt.text[s:e] for s, e, m in runs)
        if len(self.content) == 1 and all(e - s == 1 for s, e, m in runs if m):
            return nt.replaced(text)  # one char for one char: every char keeps its span
        spans, new = nt.all_spans(), []
        for s, e, m in runs:
            if not m:
                new.extend(spans[s:e])
                continue
            # HF aligns every inserted char with the char before the insertion point: the match's last
            # char (an empty match: the char before it, or the start)
            at = spans[e - 1] if e > 0 else (nt.base, nt.base)
            new.extend([at] * len(self.content))
        return nt.rewritten(text, new)

    def decode_chain(self, tokens: list[str]) -> list[str]:
        return [self._replace(t) for t in tokens]

    def token_piece(self, token: str | bytes) -> str | bytes:
        if isinstance(token, str):
            return self._replace(token)
        if self.literal:  # after a byte-producing decoder: replace in the UTF-8 bytes
            return token.replace(self.pattern.encode("utf-8"), self.content.encode("utf-8"))
        return token


class Prepend:
    """prepend + text, for a non-empty text."""

    def __init__(self, prepend: str) -> None:
        self.prepend = prepend

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Prepend":
        check_fields(d, where, ("prepend",))
        return cls(d["prepend"])

    def to_json(self) -> dict:
        return {"type": "Prepend", "prepend": self.prepend}

    def normalize(self, nt: NormalizedText) -> NormalizedText:
        return nt.prepend(self.prepend)


class Strip:
    """Drop leading (left) and/or trailing (right) White_Space."""

    def __init__(self, left: bool = True, right: bool = True) -> None:
        self.left, self.right = left, right

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Strip":
        check_fields(d, where, ("strip_left", "strip_right"))
        return cls(bool(d["strip_left"]), bool(d["strip_right"]))

    def to_json(self) -> dict:
        return {"type": "Strip", "strip_left": self.left, "strip_right": self.right}

    def normalize(self, nt: NormalizedText) -> NormalizedText:
        text = nt.text
        a = count_leading(text, is_whitespace) if self.left else 0
        b = len(text) - (count_leading(reversed(text), is_whitespace) if self.right else 0)
        if a == 0 and b == len(text):
            return nt
        return nt.slice(a, max(a, b))


class Sequence:
    """Normalizers applied in order."""

    def __init__(self, normalizers: list) -> None:
        self.normalizers = normalizers

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Sequence":
        check_fields(d, where, ("normalizers",))
        return cls([from_json(n, f"{where}.normalizers[{i}]") for i, n in enumerate(d["normalizers"])])

    def to_json(self) -> dict:
        return {"type": "Sequence", "normalizers": [n.to_json() for n in self.normalizers]}

    def normalize(self, nt: NormalizedText) -> NormalizedText:
        for n in self.normalizers:
            nt = n.normalize(nt)
        return nt


NORMALIZERS = {"NFC": Unicode, "NFD": Unicode, "NFKC": Unicode, "NFKD": Unicode, "Lowercase": Lowercase,
               "Replace": Replace, "Prepend": Prepend, "Strip": Strip, "Sequence": Sequence}


def from_json(d: dict | None, where: str = "normalizer"):
    """A normalizer from its tokenizer.json object (None stays None)."""
    return None if d is None else dispatch(d, where, NORMALIZERS)
