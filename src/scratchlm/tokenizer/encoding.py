"""The result of encoding one text (or a pair): ids, and — when asked for — offsets and token strings.

    ids[k]      the token id
    offsets[k]  (start, end) chars of the input the token came from; (0, 0) for tokens a post-processor
                added (BOS, EOS, ...); offsets of a pair's second text point into that text
    tokens[k]   the token's string in the model vocabulary (what decoders read)
    type_ids[k] 0 for the first text, 1 for the second (as the post-processor's template sets them)
Offsets, tokens and type ids are None when encoding only for ids (the fast path).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Encoding:
    """ids (+ offsets, tokens, type_ids when tracked); see module docstring."""

    ids: list[int] = field(default_factory=list)
    offsets: list[tuple[int, int]] | None = None
    tokens: list[str] | None = None
    type_ids: list[int] | None = None

    @property
    def tracked(self) -> bool:
        return self.offsets is not None

    def set_type_id(self, type_id: int) -> None:
        if self.type_ids is not None:
            self.type_ids = [type_id] * len(self.ids)

    @staticmethod
    def merge(parts: list["Encoding"], tracked: bool) -> "Encoding":
        """Concatenate encodings in order."""
        out = Encoding([], [] if tracked else None, [] if tracked else None, [] if tracked else None)
        for p in parts:
            out.ids.extend(p.ids)
            if tracked:
                out.offsets.extend(p.offsets)
                out.tokens.extend(p.tokens)
                out.type_ids.extend(p.type_ids)
        return out

    def char_to_token(self, pos: int) -> int | None:
        """Index of the first token whose offsets contain char `pos` (HF's `char_to_token`)."""
        for k, (s, e) in enumerate(self.offsets or []):
            if s <= pos < e:
                return k
        return None
