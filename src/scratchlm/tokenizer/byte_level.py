"""ByteLevel (GPT-2's byte-level BPE): the byte <-> printable-char alphabet, and the ByteLevel stage in
its three roles (tokenizer.json uses the same component as pre-tokenizer, decoder and post-processor).

Pre-tokenizer: optionally prepend " " (add_prefix_space), optionally split with the GPT-2 regex
(use_regex), then rewrite every char as the chars of its UTF-8 bytes in GPT-2's alphabet
(" " -> "Ġ", "\\n" -> "Ċ", "é" = C3 A9 -> "Ã©"), so the BPE model only ever sees 256 symbols.
Decoder: alphabet chars -> bytes -> UTF-8 (bad sequences -> U+FFFD); a token with a char outside the
alphabet (an added token such as "<｜end▁of▁sentence｜>") contributes its own UTF-8 bytes.
Post-processor: trim_offsets moves token offsets past leading/trailing spaces (ids are unchanged).
"""

from __future__ import annotations

from functools import lru_cache

import regex

from scratchlm.tokenizer.encoding import Encoding
from scratchlm.tokenizer.json_fields import check_fields
from scratchlm.tokenizer.normalized import NormalizedText, prepended, text_of
from scratchlm.tokenizer.patterns import GPT2_PATTERN
from scratchlm.tokenizer.split_delimiters import regex_pieces, regex_runs, split_text
from scratchlm.tokenizer.unicode_props import count_leading, is_whitespace



@lru_cache(maxsize=1)
def gpt2_regex() -> regex.Pattern:
    """The compiled GPT-2 pattern (compiled once per process, on first use)."""
    return regex.compile(GPT2_PATTERN)


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
    return dict(fwd), {ord(c): b for b, c in fwd.items()}, frozenset(fwd.values())


def token_to_unicode(token: bytes) -> str:
    """Render token bytes in GPT-2's printable alphabet (the form used by vocab.json / tokenizer.json)."""
    return token.decode("latin-1").translate(_tables()[0])


def is_byte_level_text(text: str) -> bool:
    """True if every char of `text` is in GPT-2's byte alphabet."""
    return _tables()[2].issuperset(text)


def unicode_to_token(text: str, where: str = "token") -> bytes:
    """Inverse of `token_to_unicode`; a clear ValueError for a char outside GPT-2's alphabet."""
    if not is_byte_level_text(text):
        bad = next(c for c in text if c not in _tables()[2])
        raise ValueError(
            f"{where} {text!r} has char {bad!r} outside GPT-2's byte-level alphabet; "
            "only byte-level BPE vocabularies (GPT-2 style) can be loaded"
        )
    return text.translate(_tables()[1]).encode("latin-1")


def _to_byte_chars(nt: str | NormalizedText) -> str | NormalizedText:
    """Rewrite each char as its UTF-8 bytes in the alphabet; each byte-char keeps its char's span."""
    if isinstance(nt, str):
        return nt.encode("utf-8", errors="surrogatepass").decode("latin-1").translate(_tables()[0])
    data = nt.text.encode("utf-8", errors="surrogatepass")
    out = data.decode("latin-1").translate(_tables()[0])
    if len(data) == len(nt.text):  # ASCII only: one byte-char per char
        return NormalizedText(out, nt.base, nt.spans)
    spans = nt.all_spans()
    new = [spans[i] for i, ch in enumerate(nt.text) for _ in range(len(ch.encode("utf-8", errors="surrogatepass")))]
    return nt.rewritten(out, new)


class ByteLevel:
    """The ByteLevel pre-tokenizer / decoder / post-processor (see module docstring)."""

    def __init__(self, add_prefix_space: bool = True, trim_offsets: bool = True, use_regex: bool = True) -> None:
        self.add_prefix_space = add_prefix_space
        self.trim_offsets = trim_offsets
        self.use_regex = use_regex

    @classmethod
    def from_json(cls, d: dict, where: str) -> "ByteLevel":
        check_fields(d, where, optional=("add_prefix_space", "trim_offsets", "use_regex"))
        return cls(bool(d.get("add_prefix_space", True)), bool(d.get("trim_offsets", True)), bool(d.get("use_regex", True)))

    def to_json(self) -> dict:
        return {"type": "ByteLevel", "add_prefix_space": self.add_prefix_space, "trim_offsets": self.trim_offsets,
                "use_regex": self.use_regex}

    # -- pre-tokenizer ------------------------------------------------------------------------
    def pre_tokenize(self, pieces: list) -> list:
        """Pieces (str or NormalizedText) -> byte-level pre-tokens."""
        out = []
        for nt in pieces:
            if self.add_prefix_space and not text_of(nt).startswith(" "):
                nt = prepended(nt, " ")
            if not self.use_regex:
                parts = [nt] if text_of(nt) else []
            elif isinstance(nt, str):
                parts = regex_pieces(gpt2_regex(), nt)  # the GPT-2 regex never matches empty
            else:
                parts = split_text(nt, regex_runs(gpt2_regex(), nt.text), "Isolated")
            out.extend(map(_to_byte_chars, parts))
        return out

    # -- decoder ------------------------------------------------------------------------------
    @staticmethod
    def token_bytes(token: str) -> bytes:
        """Bytes of one token: its alphabet chars as bytes, or its own UTF-8 when it is not byte-level."""
        return unicode_to_token(token) if is_byte_level_text(token) else token.encode("utf-8")

    def decode_chain(self, tokens: list[str]) -> list[str]:
        data = b"".join(self.token_bytes(t) for t in tokens)
        return [data.decode("utf-8", errors="replace")]

    # -- post-processor -----------------------------------------------------------------------
    def added_tokens(self, is_pair: bool) -> int:
        return 0

    def process(self, encodings: list[Encoding], add_special_tokens: bool) -> list[Encoding]:
        if self.trim_offsets:
            for enc in encodings:
                trim_offsets(enc, self.add_prefix_space)
        return encodings


def _is_space(ch: str) -> bool:
    return ch == "Ġ" or is_whitespace(ch)


def trim_offsets(enc: Encoding, add_prefix_space: bool) -> None:
    """Move offsets past the spaces a token starts/ends with (HF ByteLevel `process_offsets`)."""
    if enc.offsets is None or enc.tokens is None:
        return
    for i, (token, (start, end)) in enumerate(zip(enc.tokens, enc.offsets)):
        lead, trail = count_leading(token, _is_space), count_leading(reversed(token), _is_space)
        if lead == 0 and trail == 0:
            continue
        if lead and (i == 0 or start == 0) and add_prefix_space and lead == 1:
            lead = 0
        if lead:
            start = min(start + lead, end)
        if trail and end >= trail:
            end = max(end - trail, start)
        enc.offsets[i] = (start, end)
