"""Per-row stop conditions: stop token ids and stop strings.

A row is done at its first token in `stop_token_ids`, or as soon as its decoded text contains one
of `stop_strings` (OpenAI semantics: the returned text ends just before the stop string). Stop
strings need a tokenizer; the text is kept incrementally (see detokenize.py), and only the tail that
could hold a new match is searched:  search from max(0, len(text) - len(delta) - max_len + 1).
Streaming holds back any text suffix that is a prefix of a stop string (`stable_len`), so a stop
string is never emitted, even in part.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scratchlm.generate.detokenize import IncrementalDetokenizer


class StopChecker:
    """Tracks, for each of `batch_size` rows, whether it has stopped, and why, and its text."""

    def __init__(
        self, batch_size: int, stop_token_ids: Iterable[int] = (), stop_strings: Iterable[str] = (), tokenizer: Any = None,
        track_text: bool = False,
    ) -> None:
        self.stop_ids = {int(t) for t in stop_token_ids}
        self.stop_strings = [s for s in stop_strings]
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop_strings!r}")
        if (self.stop_strings or track_text) and tokenizer is None:
            raise ValueError("stop strings and text streaming need the tokenizer: pass tokenizer=Tokenizer.load(DIR)")
        self.max_len = max((len(s) for s in self.stop_strings), default=0)
        use_text = bool(self.stop_strings) or track_text
        self.decoders = [IncrementalDetokenizer(tokenizer) for _ in range(batch_size)] if use_text else None
        self.done = [False] * batch_size
        self.reasons: list[str | None] = [None] * batch_size

    @property
    def all_done(self) -> bool:
        return all(self.done)

    def text(self, row: int) -> str:
        return "" if self.decoders is None else self.decoders[row].text

    def push(self, row: int, token: int) -> None:
        """Record row's next token and update its state; the text of a stop token id is not added."""
        dec = None if self.decoders is None else self.decoders[row]
        if token in self.stop_ids:
            self.done[row], self.reasons[row] = True, "stop"
            if dec is not None:
                dec.flush()  # a partial character before the stop token becomes U+FFFD, as in decode()
            return
        if dec is None:
            return
        delta = dec.push(token)
        if not self.stop_strings or not delta:
            return
        start = max(0, len(dec.text) - len(delta) - self.max_len + 1)
        hits = [i for i in (dec.text.find(s, start) for s in self.stop_strings) if i >= 0]
        if hits:
            dec.text = dec.text[: min(hits)]
            self.done[row], self.reasons[row] = True, "stop"

    def finish(self, row: int) -> None:
        """End of generation for `row`; if it had not stopped, it ended by length (flush its text)."""
        if self.done[row]:
            return
        self.done[row], self.reasons[row] = True, "length"
        if self.decoders is not None:
            self.decoders[row].flush()

    def stable_len(self, row: int) -> int:
        """Length of the row's text that can be shown: the end that may begin a stop string is held back."""
        text = self.text(row)
        if self.done[row]:
            return len(text)
        for k in range(min(self.max_len - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return len(text) - k
        return len(text)
