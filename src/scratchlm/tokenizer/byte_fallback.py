"""Byte fallback (SentencePiece-converted Llama-2 / Mistral / Gemma tokenizers): a char missing from the
vocab is spelled as its UTF-8 bytes with the 256 tokens "<0x00>" ... "<0xFF>".

Model side: char c not in vocab -> [id("<0xNN>") for NN in utf8(c)], when all those tokens exist
(otherwise the BPE model falls back to its unk token, or drops the char).
Decoder side (ByteFallback): consecutive "<0xNN>" tokens are gathered into bytes; a valid UTF-8 run
becomes its text, an invalid one becomes one U+FFFD per byte (HF's rule); other tokens pass through.
"""

from __future__ import annotations

from scratchlm.tokenizer.json_fields import check_fields


def byte_token(b: int) -> str:
    """The vocab string of byte b: "<0x0A>" for 10 (two uppercase hex digits)."""
    return f"<0x{b:02X}>"


def parse_byte_token(token: str) -> int | None:
    """b for a "<0xNN>" token, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def fallback_ids(ch: str, vocab: dict[str, int]) -> list[int] | None:
    """Ids of the byte tokens spelling `ch`, or None if some byte token is missing."""
    ids = []
    for b in ch.encode("utf-8", errors="surrogatepass"):
        i = vocab.get(byte_token(b))
        if i is None:
            return None
        ids.append(i)
    return ids


class ByteFallback:
    """The ByteFallback decoder (see module docstring)."""

    @classmethod
    def from_json(cls, d: dict, where: str) -> "ByteFallback":
        check_fields(d, where)
        return cls()

    def to_json(self) -> dict:
        return {"type": "ByteFallback"}

    def decode_chain(self, tokens: list[str]) -> list[str]:
        out: list[str] = []
        pending = bytearray()
        for token in tokens + [None]:
            b = parse_byte_token(token) if token is not None else None
            if b is not None:
                pending.append(b)
                continue
            if pending:
                try:
                    out.append(pending.decode("utf-8"))
                except UnicodeDecodeError:
                    out.extend(["\ufffd"] * len(pending))
                pending = bytearray()
            if token is not None:
                out.append(token)
        return out

    def token_piece(self, token: str | bytes) -> str | bytes:
        """One token in the middle of a sequence: a byte token is its raw byte."""
        b = parse_byte_token(token) if isinstance(token, str) else None
        return bytes([b]) if b is not None else token
