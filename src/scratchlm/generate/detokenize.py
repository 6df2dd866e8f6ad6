"""Incremental detokenization: token ids in, text deltas out, never splitting a UTF-8 character.

Byte-level BPE tokens are byte strings; one character (e.g. "é" = C3 A9, an emoji = 4 bytes) may be
spread over several tokens. Each token's bytes go through an incremental UTF-8 decoder, which emits
only complete characters and keeps an unfinished one buffered until its last byte arrives:
    delta_t = utf8_incremental.decode(bytes(token_t))
so "".join(deltas) == bytes(all tokens).decode("utf-8", "replace") once the stream is finished.
Token bytes come from `tokenizer.vocab` (id -> bytes); ids not in it (e.g. special tokens kept apart)
fall back to `tokenizer.decode([id])`.
"""

from __future__ import annotations

import codecs
from typing import Any


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The raw bytes of one token id."""
    vocab = getattr(tokenizer, "vocab", None)
    if isinstance(vocab, dict) and token in vocab and isinstance(vocab[token], (bytes, bytearray)):
        return bytes(vocab[token])
    return tokenizer.decode([token]).encode("utf-8")


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas made of whole characters only."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, token: int) -> str:
        """Add one token; return the newly completed characters (possibly "")."""
        delta = self._utf8.decode(token_bytes(self.tokenizer, token))
        self.text += delta
        return delta

    def flush(self) -> str:
        """End of stream: a dangling partial character becomes U+FFFD."""
        delta = self._utf8.decode(b"", final=True)
        self.text += delta
        return delta
