"""Pre-tokenization for BPE training: special-token splitting and the GPT-2 regex.

Text is first cut at special tokens (matched longest-first), then each ordinary segment is split by
the GPT-2 pattern into pre-tokens; BPE never merges across either kind of boundary. (Encoding runs
the general pipeline of pipeline.py; this is the fixed GPT-2 layout `train_bpe` learns on.)
"""

from __future__ import annotations

from typing import Iterator

import regex

from scratchlm.tokenizer.byte_level import GPT2_PATTERN, gpt2_regex
from scratchlm.tokenizer.split_delimiters import regex_pieces

__all__ = ["GPT2_PATTERN", "gpt2_regex", "pretokenize", "special_regex", "split_on_specials"]


def pretokenize(text: str) -> list[str]:
    """Split ordinary text (no special tokens) into GPT-2 pre-tokens; ''.join(result) == text (cut where
    encoding cuts: chars newer than the regex engines' Unicode tables are unassigned, see unicode_props)."""
    return regex_pieces(gpt2_regex(), text)


def special_regex(special_tokens: list[str] | tuple[str, ...]) -> regex.Pattern | None:
    """An alternation of the escaped specials, longest first, so that a special that is a prefix of
    another (or `<|endoftext|><|endoftext|>` next to `<|endoftext|>`) matches the longest one.
    None when there are no specials."""
    if not special_tokens:
        return None
    ordered = sorted(set(special_tokens), key=lambda s: (-len(s), s))
    return regex.compile("|".join(regex.escape(s) for s in ordered))


def split_on_specials(text: str, pattern: regex.Pattern | None) -> Iterator[tuple[str, bool]]:
    """Yield (piece, is_special) in order, skipping empty ordinary pieces."""
    if pattern is None:
        if text:
            yield text, False
        return
    pos = 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            yield text[pos:m.start()], False
        yield m.group(), True
        pos = m.end()
    if pos < len(text):
        yield text[pos:], False
