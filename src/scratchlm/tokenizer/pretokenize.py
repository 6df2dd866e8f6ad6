"""Pre-tokenization: special-token splitting, the GPT-2 regex, and GPT-2's byte <-> unicode alphabet.

Text is first cut at special tokens (matched longest-first), then each ordinary segment is split by
the GPT-2 pattern into pre-tokens; BPE never merges across either kind of boundary.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import regex

# GPT-2's pre-tokenization pattern (also HF `ByteLevel(use_regex=True)` and tiktoken's "gpt2").
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def gpt2_regex() -> regex.Pattern:
    """The compiled GPT-2 pattern (compiled once per process, on first use)."""
    return regex.compile(GPT2_PATTERN)


def pretokenize(text: str) -> list[str]:
    """Split ordinary text (no special tokens) into GPT-2 pre-tokens; ''.join(result) == text."""
    return gpt2_regex().findall(text)


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


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map byte -> printable unicode char.

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other 68 bytes map,
    in increasing order, to chr(256), chr(257), ... (so b' ' -> 'Ġ', b'\\n' -> 'Ċ')."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping: dict[int, str] = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of `bytes_to_unicode`."""
    return {c: b for b, c in bytes_to_unicode().items()}


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[int, str], dict[int, int], frozenset[str]]:
    """str.translate tables: byte value -> alphabet char, alphabet char -> byte value; the alphabet."""
    fwd = bytes_to_unicode()
    return {b: c for b, c in fwd.items()}, {ord(c): b for b, c in fwd.items()}, frozenset(fwd.values())


def token_to_unicode(token: bytes) -> str:
    """Render token bytes in GPT-2's printable alphabet (the form used by vocab.json / tokenizer.json)."""
    return token.decode("latin-1").translate(_tables()[0])


def unicode_to_token(text: str, where: str = "token") -> bytes:
    """Inverse of `token_to_unicode`; a clear ValueError for a char outside GPT-2's alphabet."""
    _, back, alphabet = _tables()
    if not alphabet.issuperset(text):
        bad = next(c for c in text if c not in alphabet)
        raise ValueError(
            f"{where} {text!r} has char {bad!r} outside GPT-2's byte-level alphabet; "
            "only byte-level BPE vocabularies (GPT-2 style) can be loaded"
        )
    return text.translate(back).encode("latin-1")
