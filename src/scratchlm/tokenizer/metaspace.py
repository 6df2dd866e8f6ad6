"""Metaspace (SentencePiece's visible space "▁"), as pre-tokenizer and decoder.

Pre-tokenizer, on each piece of text:
    every " " becomes the replacement char (default "▁");
    prepend_scheme "always": prepend "▁" unless the piece starts with it;
                   "first":  the same, only for the piece that starts at input position 0;
                   "never":  nothing;
    split=True: cut before every "▁" (MergedWithNext: "▁Hello▁world" -> "▁Hello" | "▁world").
Decoder: "▁" -> " " in every token, except that the very first token drops its "▁" when the
prepend scheme is not "never" (undoing the prepended space).
"""

from __future__ import annotations

from scratchlm.tokenizer.json_fields import check_fields
from scratchlm.tokenizer.normalized import prepended, replaced, text_of
import regex

from scratchlm.tokenizer.split_delimiters import char_regex, regex_runs, split_text

PREPEND_SCHEMES = ("always", "first", "never")


class Metaspace:
    """Metaspace pre-tokenizer / decoder (see module docstring)."""

    def __init__(self, replacement: str = "▁", prepend_scheme: str = "always", split: bool = True) -> None:
        if not isinstance(replacement, str) or len(replacement) != 1:
            raise ValueError(f"Metaspace replacement {replacement!r} must be one character (e.g. '▁')")
        if prepend_scheme not in PREPEND_SCHEMES:
            raise ValueError(f"Metaspace prepend_scheme {prepend_scheme!r} is not one of {PREPEND_SCHEMES}")
        self.replacement = replacement
        self.prepend_scheme = prepend_scheme
        self.split = split

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Metaspace":
        check_fields(d, where, ("replacement",), ("add_prefix_space", "prepend_scheme", "split", "str_rep"))
        scheme = d.get("prepend_scheme", "always")
        if d.get("add_prefix_space") is False:  # the older field; HF accepts it only with scheme "never"
            if scheme != "never":
                raise ValueError(f"{where} Metaspace: add_prefix_space=false does not match prepend_scheme {scheme!r}")
        return cls(d["replacement"], scheme, bool(d.get("split", True)))

    def to_json(self) -> dict:
        return {"type": "Metaspace", "replacement": self.replacement, "prepend_scheme": self.prepend_scheme,
                "split": self.split}

    @property
    def needs_positions(self) -> bool:
        """True when it must know where a piece sits in the input (prepend_scheme "first")."""
        return self.prepend_scheme == "first"

    def pre_tokenize(self, pieces: list) -> list:
        """Pieces (str, or NormalizedText when positions matter) -> pre-tokens."""
        rep, out = self.replacement, []
        for nt in pieces:
            nt = replaced(nt, text_of(nt).replace(" ", rep))
            first = self.prepend_scheme == "first" and nt.original_start() == 0
            if (self.prepend_scheme == "always" or first) and not text_of(nt).startswith(rep):
                nt = prepended(nt, rep)
            if self.split:
                out.extend(split_text(nt, regex_runs(char_regex(regex.escape(rep)), text_of(nt)), "MergedWithNext"))
            elif text_of(nt):
                out.append(nt)
        return out

    def decode_chain(self, tokens: list[str]) -> list[str]:
        rep = self.replacement
        out = []
        for i, token in enumerate(tokens):
            drop = i == 0 and self.prepend_scheme != "never"
            out.append(token.replace(rep, "") if drop else token.replace(rep, " "))
        return out

    def token_piece(self, token: str | bytes) -> str | bytes:
        """One token's text in the middle of a sequence ("▁" -> " ")."""
        return token.replace(self.replacement, " ") if isinstance(token, str) else token
