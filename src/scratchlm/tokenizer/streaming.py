"""Constant-memory encoding of a text stream: buffer, cut at a provably safe point, encode, repeat.

A cut at position c of the buffer is safe when encoding buf[:c] and the rest separately gives the same
ids as encoding the whole stream. We only cut where
  * every special-token decision before c is final: a special can be up to L chars long, so matches
    starting before len(buf) - L + 1 cannot change when more text arrives; and
  * c is a pre-token boundary that more text cannot move: right after a newline between two chars that
    are not whitespace (letters, numbers, visible ASCII: ``x\\nY``), or else at the start of the second-to-last GPT-2 pre-token of the tail (the
    regex looks at most 2 chars past a pre-token's end, e.g. "'" + "r" may still become "'re").
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable, Iterator

import regex

from scratchlm.tokenizer.pretokenize import gpt2_regex

if TYPE_CHECKING:
    from scratchlm.tokenizer.bpe import Tokenizer

BUFFER_CHARS = 1 << 16


@lru_cache(maxsize=1)
def _last_safe_newline() -> regex.Pattern:
    return regex.compile(r"(?r)[\p{L}\p{N}!-~]\n(?=[\p{L}\p{N}!-~])")


def safe_cut(buf: str, special_re: regex.Pattern | None, max_special: int) -> int:
    """The largest safe cut position found in `buf` (0 when there is none yet)."""
    stable = len(buf) - max_special + 1 if special_re is not None else len(buf)
    if stable <= 0:
        return 0
    last_end = 0
    if special_re is not None:
        for m in special_re.finditer(buf):
            if m.start() >= stable:
                break
            last_end = m.end()
    m = _last_safe_newline().search(buf, last_end, stable)
    if m is not None:
        return m.start() + 2
    starts = [m.start() for m in gpt2_regex().finditer(buf, last_end, stable)]
    return starts[-2] if len(starts) >= 3 else last_end


def encode_stream_chunks(tok: "Tokenizer", iterable: Iterable[str]) -> Iterator[list[int]]:
    """Yield lists of ids of ''.join(iterable), holding at most ~BUFFER_CHARS (+ one item) of text."""
    max_special = max((len(s) for s in tok.special_tokens), default=0)
    buf = ""
    for piece in iterable:
        if not isinstance(piece, str):
            raise ValueError(f"encode_iterable expects str items, got {type(piece).__name__}; open files in text mode")
        buf += piece
        if len(buf) < BUFFER_CHARS:
            continue
        cut = safe_cut(buf, tok._special_re, max_special)
        if cut > 0:
            yield tok.encode(buf[:cut])
            buf = buf[cut:]
    if buf:
        yield tok.encode(buf)


def encode_stream(tok: "Tokenizer", iterable: Iterable[str]) -> Iterator[int]:
    """The ids of `encode_stream_chunks`, one at a time."""
    return itertools.chain.from_iterable(encode_stream_chunks(tok, iterable))
