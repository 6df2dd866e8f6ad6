"""A piece of text on its way through the tokenizer pipeline, with each char's place in the input.

HF `tokenizers` calls this a NormalizedString: normalizers and pre-tokenizers rewrite and cut the text,
and every char of the result remembers the span [start, end) of input chars it came from, so token
offsets (and the assistant-token mask of chat templates) can point back into the original text.

Two representations, so the common case costs nothing:
    spans is None  ->  char i came from input char  base + i          (identity: nothing was rewritten,
                       or chars were replaced one for one, e.g. " " -> "▁")
    spans is list  ->  char i came from input chars spans[i] = (start, end)
"""

from __future__ import annotations

Span = tuple[int, int]


class NormalizedText:
    """Text plus the input span of each of its chars (see module docstring)."""

    __slots__ = ("text", "base", "spans")

    def __init__(self, text: str, base: int = 0, spans: list[Span] | None = None) -> None:
        self.text = text
        self.base = base
        self.spans = spans

    def __repr__(self) -> str:
        return f"NormalizedText({self.text!r}, start={self.original_start()})"

    def __len__(self) -> int:
        return len(self.text)

    def original_start(self) -> int:
        """Input position of the first char (HF's `offsets_original().0`)."""
        if self.spans is None:
            return self.base
        return self.spans[0][0] if self.spans else self.base

    def span(self, i: int, j: int) -> Span:
        """Input span covered by text[i:j] (j > i)."""
        if self.spans is None:
            return self.base + i, self.base + j
        return self.spans[i][0], self.spans[j - 1][1]

    def all_spans(self) -> list[Span]:
        """The explicit per-char spans (materialised from the identity form if needed)."""
        if self.spans is not None:
            return self.spans
        return [(self.base + i, self.base + i + 1) for i in range(len(self.text))]

    def slice(self, i: int, j: int) -> "NormalizedText":
        """text[i:j] with its spans."""
        if self.spans is None:
            return NormalizedText(self.text[i:j], self.base + i)
        base = self.spans[i][0] if i < len(self.spans) else self.original_start()
        return NormalizedText(self.text[i:j], base, self.spans[i:j])

    def replaced(self, text: str) -> "NormalizedText":
        """Same spans, new text of the same length (a char-for-char rewrite)."""
        if len(text) != len(self.text):
            raise ValueError("internal error: replaced() needs a text of the same length")
        return NormalizedText(text, self.base, self.spans)

    def rewritten(self, text: str, spans: list[Span]) -> "NormalizedText":
        """New text with explicit spans (one per char)."""
        return NormalizedText(text, self.original_start(), spans)

    def prepend(self, prefix: str) -> "NormalizedText":
        """prefix + text; the new chars share the span of the first char (as HF aligns them).
        An empty text stays empty (HF prepends nothing to it)."""
        if not self.text or not prefix:
            return self
        spans = self.all_spans()
        return NormalizedText(prefix + self.text, self.base, [spans[0]] * len(prefix) + spans)


# Pre-tokenizers work on either form: NormalizedText when offsets are tracked, plain str when only ids
# are wanted (no per-piece bookkeeping). These helpers treat both alike.
Piece = "str | NormalizedText"


def text_of(p: str | NormalizedText) -> str:
    return p if isinstance(p, str) else p.text


def slice_of(p: str | NormalizedText, i: int, j: int) -> str | NormalizedText:
    return p[i:j] if isinstance(p, str) else p.slice(i, j)


def replaced(p: str | NormalizedText, text: str) -> str | NormalizedText:
    """A char-for-char rewrite of p."""
    return text if isinstance(p, str) else p.replaced(text)


def prepended(p: str | NormalizedText, prefix: str) -> str | NormalizedText:
    """prefix + p (nothing for an empty p, as HF)."""
    if isinstance(p, str):
        return prefix + p if p else p
    return p.prepend(prefix)
