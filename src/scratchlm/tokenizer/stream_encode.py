"""Constant-memory encoding of a text stream: buffer, cut at a provably safe point, encode, repeat.

A cut at position c of the buffer is safe when encoding buf[:c] and the rest separately gives the same
ids as encoding the whole stream. We only cut where
  * every added-token decision before c is final: a token can be up to L chars long, so matches
    starting before len(buf) - L + 1 cannot change when more text arrives; and
  * c is a pre-token boundary that more text cannot move: right after a newline between two chars that
    are not whitespace (letters, numbers, visible ASCII: ``x\\nY``) — exact for the GPT-2, Llama-3 and
    Qwen2 regexes (patterns.NEWLINE_SAFE) — or, for GPT-2's regex, at the start of the second-to-last
    pre-token of the tail (the regex looks at most 2 chars past a pre-token's end, e.g. "'" + "r" may
    still become "'re").
A tokenizer whose pipeline gives no such guarantee (a normalizer that rewrites across lines, Metaspace
prepending to each piece, added tokens that strip spaces) is encoded once its whole stream has arrived.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any, Iterable, Iterator

import regex

from scratchlm.tokenizer.byte_level import ByteLevel, gpt2_regex
from scratchlm.tokenizer.normalizers import Unicode
from scratchlm.tokenizer.patterns import GPT2_PATTERN, NEWLINE_SAFE
from scratchlm.tokenizer.pre_tokenizers import Sequence, Split

BUFFER_CHARS = 1 << 16


@lru_cache(maxsize=1)
def _last_safe_newline() -> regex.Pattern:
    return regex.compile(r"(?r)[\p{L}\p{N}!-~]\n(?=[\p{L}\p{N}!-~])")


def split_pattern(tok: Any) -> str | None:
    """The pre-token regex if `tok` cuts text only with it (then ByteLevel without prefix), else None."""
    pre = tok.pre_tokenizer
    if isinstance(pre, ByteLevel):
        return GPT2_PATTERN if pre.use_regex and not pre.add_prefix_space else None
    if isinstance(pre, Sequence) and len(pre.pretokenizers) == 2:
        split, bl = pre.pretokenizers
        if (isinstance(split, Split) and not split.literal and split.behavior == "Isolated" and not split.invert
                and isinstance(bl, ByteLevel) and not bl.use_regex and not bl.add_prefix_space):
            return split.pattern
    return None


def stream_safe(tok: Any) -> str | None:
    """The pattern whose cut rules are exact for `tok` (module docstring), or None."""
    if tok.normalizer is not None and not isinstance(tok.normalizer, Unicode):
        return None
    if any(t.lstrip or t.rstrip or t.single_word for t in tok.added.tokens):
        return None
    pattern = split_pattern(tok)
    return pattern if pattern in NEWLINE_SAFE else None


def safe_cut(buf: str, special_re: regex.Pattern | None, max_special: int, pattern: str = GPT2_PATTERN) -> int:
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
    if pattern != GPT2_PATTERN:
        return last_end
    starts = [m.start() for m in gpt2_regex().finditer(buf, last_end, stable)]
    return starts[-2] if len(starts) >= 3 else last_end


def encode_stream_chunks(tok: Any, iterable: Iterable[str]) -> Iterator[list[int]]:
    """Yield lists of ids of ''.join(iterable), holding at most ~BUFFER_CHARS (+ one item) of text when
    the pipeline allows safe cuts (see module docstring)."""
    pattern = stream_safe(tok)
    matcher = tok.added.matcher_regex() if pattern is not None else None  # (cuts need it; whole texts do not)
    max_special = tok.added.max_len
    buf = ""
    for piece in iterable:
        if not isinstance(piece, str):
            raise ValueError(f"encode_iterable expects str items, got {type(piece).__name__}; open files in text mode")
        buf += piece
        if pattern is None or len(buf) < BUFFER_CHARS:
            continue
        cut = safe_cut(buf, matcher, max_special, pattern)
        if cut > 0:
            yield tok.encode(buf[:cut])
            buf = buf[cut:]
    if buf:
        yield tok.encode(buf)


def encode_stream(tok: Any, iterable: Iterable[str]) -> Iterator[int]:
    """The ids of `encode_stream_chunks`, one at a time."""
    return itertools.chain.from_iterable(encode_stream_chunks(tok, iterable))
