"""The decoder of GGUF SentencePiece vocabularies: each token's piece, as llama.cpp renders it.

llama.cpp decodes token by token from the token's type (its attributes, `llama_token_to_piece`):
    control / unknown   its text; nothing when special tokens are not rendered
    user-defined        its text, as is
    normal              its text with "▁" -> " "
    byte "<0xNN>"       the byte NN
    unused / undefined  nothing
and `llama_detokenize` drops one leading " " from the first token's piece when the vocabulary adds a space
prefix (a hidden first token, e.g. a BOS rendered as nothing, uses that up). Pieces are bytes: byte tokens
may spell invalid UTF-8, which llama.cpp returns as is.

Tokenizer.decode(ids, skip_special_tokens=s) is llama.cpp's `common_detokenize(ids, special=not s)`
(= llama_detokenize(remove_special=false, unparse_special=not s)). `to_json` writes the HF decoder chain a
converted Llama tokenizer.json has (Replace "▁" -> " ", ByteFallback, Fuse, Strip one leading space), which
`hf_form_risks` compares with these rules.
"""

from __future__ import annotations

from scratchlm.tokenizer.byte_fallback import parse_byte_token

EXAMPLES = 4


class TokenPieces:
    """Token text -> piece bytes (special tokens rendered); `hidden`: the texts rendered as nothing unless
    special tokens are; `strip_first_space`: llama.cpp's add_space_prefix."""

    def __init__(self, pieces: dict[str, bytes], hidden: set[str], strip_first_space: bool) -> None:
        self.pieces, self.hidden, self.strip_first_space = pieces, set(hidden), strip_first_space

    def to_json(self) -> dict:
        chain = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                 {"type": "Fuse"}]
        if self.strip_first_space:
            chain.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        return {"type": "Sequence", "decoders": chain}

    def piece(self, token: str, special: bool = True) -> bytes:
        """One token's bytes (llama_token_to_piece with lstrip 0)."""
        if not special and token in self.hidden:
            return b""
        return self.pieces[token]

    def render(self, tokens: list[str], skip_special: bool) -> bytes:
        """The bytes of a token sequence (llama_detokenize, see module docstring)."""
        out = []
        for k, token in enumerate(tokens):
            p = self.piece(token, not skip_special)
            out.append(p[1:] if k == 0 and self.strip_first_space and p.startswith(b" ") else p)
        return b"".join(out)

    def decode_chain(self, tokens: list[str]) -> list[str]:
        return [self.render(tokens, False).decode("utf-8", errors="replace")]

    def token_piece(self, token: str | bytes) -> str | bytes:
        """One token in the middle of a sequence, special tokens rendered."""
        return self.pieces[token] if isinstance(token, str) else token

    def hf_form_risks(self) -> list[str]:
        """Why the HF decoder chain (to_json) may render ids differently from these pieces."""
        def hf_piece(t: str) -> bytes:
            b = parse_byte_token(t)
            return bytes([b]) if b is not None else t.replace("▁", " ").encode("utf-8")

        differ = [t for t, p in self.pieces.items() if p != hf_piece(t)]
        out = []
        if differ:
            out.append(f"D: {len(differ)} tokens render differently through HF's decoder chain (e.g. {differ[:EXAMPLES]}): "
                       "unused tokens are nothing in llama.cpp, user-defined and control texts are not unescaped")
        if self.strip_first_space and self.hidden:
            out.append("D1: llama.cpp strips the leading space from the first token's piece even when that token is "
                       "hidden (a skipped BOS then keeps the space); HF strips the first space of the joined text")
        return out
