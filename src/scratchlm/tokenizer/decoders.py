"""Decoders: token strings -> text, each stage rewriting the list of strings, then joined.

    ByteLevel                byte alphabet -> bytes -> UTF-8        (byte_level.py)
    Metaspace                "▁" -> " ", first token's "▁" dropped (metaspace.py)
    ByteFallback             "<0xNN>" runs -> UTF-8                 (byte_fallback.py)
    Replace(pattern, c)      in every token                         (normalizers.py, the same component)
    Fuse                     join all tokens into one
    Strip(content, start, stop)  drop up to `start` leading and `stop` trailing `content` chars per token
    Sequence([...])          in order
With no decoder, tokens are joined with " " (HF's default).

`token_bytes` gives one token's bytes as they appear in the middle of a decoded sequence ("▁Hi" -> b" Hi",
"<0x0A>" -> b"\\n", byte-level "Ġ" -> b" "); the streaming detokenizer builds text from these.
"""

from __future__ import annotations

from scratchlm.tokenizer.byte_fallback import ByteFallback
from scratchlm.tokenizer.byte_level import ByteLevel
from scratchlm.tokenizer.json_fields import check_fields, dispatch
from scratchlm.tokenizer.metaspace import Metaspace
from scratchlm.tokenizer.normalizers import Replace


class Fuse:
    """All tokens joined into one string."""

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Fuse":
        check_fields(d, where)
        return cls()

    def to_json(self) -> dict:
        return {"type": "Fuse"}

    def decode_chain(self, tokens: list[str]) -> list[str]:
        return ["".join(tokens)]

    def token_piece(self, token: str | bytes) -> str | bytes:
        return token


class Strip:
    """Per token: drop up to `start` leading and up to `stop` trailing `content` chars."""

    def __init__(self, content: str, start: int, stop: int) -> None:
        self.content, self.start, self.stop = content, start, stop

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Strip":
        check_fields(d, where, ("content", "start", "stop"))
        return cls(d["content"], int(d["start"]), int(d["stop"]))

    def to_json(self) -> dict:
        return {"type": "Strip", "content": self.content, "start": self.start, "stop": self.stop}

    def _strip(self, token: str) -> str:
        a = 0
        while a < min(self.start, len(token)) and token[a] == self.content:
            a += 1
        b = len(token)
        while len(token) - b < self.stop and b > a and token[b - 1] == self.content:
            b -= 1
        return token[a:b]

    def decode_chain(self, tokens: list[str]) -> list[str]:
        return [self._strip(t) for t in tokens]

    def token_piece(self, token: str | bytes) -> str | bytes:
        return token  # strips only touch the ends of a decoded sequence


class Sequence:
    """Decoders applied in order."""

    def __init__(self, decoders: list) -> None:
        self.decoders = decoders

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Sequence":
        check_fields(d, where, ("decoders",))
        return cls([from_json(x, f"{where}.decoders[{i}]") for i, x in enumerate(d["decoders"])])

    def to_json(self) -> dict:
        return {"type": "Sequence", "decoders": [x.to_json() for x in self.decoders]}

    def decode_chain(self, tokens: list[str]) -> list[str]:
        for x in self.decoders:
            tokens = x.decode_chain(tokens)
        return tokens

    def token_piece(self, token: str | bytes) -> str | bytes:
        for x in self.decoders:
            token = token_piece(x, token)
        return token


DECODERS = {"ByteLevel": ByteLevel, "Metaspace": Metaspace, "ByteFallback": ByteFallback, "Replace": Replace,
            "Fuse": Fuse, "Strip": Strip, "Sequence": Sequence}


def from_json(d: dict | None, where: str = "decoder"):
    """A decoder from its tokenizer.json object (None stays None)."""
    return None if d is None else dispatch(d, where, DECODERS)


def token_piece(decoder, token: str | bytes) -> str | bytes:
    """One token through one decoder stage, as in the middle of a sequence."""
    if isinstance(decoder, ByteLevel):
        return decoder.token_bytes(token) if isinstance(token, str) else token
    return decoder.token_piece(token)


def decode_tokens(decoder, tokens: list[str]) -> str:
    """The decoded text of token strings (HF: no decoder -> joined with spaces)."""
    if decoder is None:
        return " ".join(tokens)
    return "".join(decoder.decode_chain(tokens))


def token_bytes(decoder, token: str) -> bytes:
    """One token's bytes in the middle of a decoded sequence (see module docstring)."""
    piece = token if decoder is None else token_piece(decoder, token)
    return piece if isinstance(piece, bytes) else piece.encode("utf-8", errors="surrogatepass")
