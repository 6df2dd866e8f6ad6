"""The byte-level BPE tokenizer: encode (reference, from scratch, or tiktoken fast path) and decode.

Encoding one pre-token (reference):
    ids = [id(byte) for byte in utf8(pretoken)]
    while some adjacent pair (x, y) is a merge: take the one with the lowest merge rank and replace
    all its occurrences, left to right, by id(x + y).
Special tokens are cut out first (longest match wins) and map straight to their ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from scratchlm.tokenizer.pretokenize import pretokenize, special_regex, split_on_specials

IMPLS = ("reference", "tiktoken")
CACHE_ENTRIES = 1 << 14  # bounded pre-token -> ids cache (cleared when full: memory stays constant)


def _check_vocab(vocab: dict[int, bytes]) -> None:
    for i, t in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise ValueError(f"vocab id {i!r} must be a non-negative int")
        if not isinstance(t, bytes) or not t:
            raise ValueError(f"vocab[{i}] = {t!r} must be non-empty bytes")


def _merge_table(merges: list[tuple[bytes, bytes]], ids: dict[bytes, int]) -> dict[tuple[int, int], tuple[int, int]]:
    """(id_a, id_b) -> (rank, id_ab); the first rank wins for a repeated pair."""
    table: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, (a, b) in enumerate(merges):
        try:
            key, new = (ids[a], ids[b]), ids[a + b]
        except KeyError as exc:
            raise ValueError(
                f"merge #{rank} ({a!r}, {b!r}) uses or makes token {exc.args[0]!r}, which is not in the vocab; "
                "the vocab must hold both parts and their concatenation"
            ) from None
        table.setdefault(key, (rank, new))
    return table


class Tokenizer:
    """Byte-level BPE: `vocab` id -> bytes, `merges` in rank order, `special_tokens` never split.

    A special already in `vocab` (same bytes) keeps its id; otherwise it gets the next free id.
    `impl="tiktoken"` encodes ordinary text with a tiktoken encoding built from these merges (same ids)."""

    def __init__(
        self,
        vocab: dict[int, bytes],
        merges: list[tuple[bytes, bytes]],
        special_tokens: list[str] | None = None,
        *,
        impl: str = "reference",
    ) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
        _check_vocab(vocab)
        self.vocab: dict[int, bytes] = dict(vocab)
        self.merges: list[tuple[bytes, bytes]] = [(bytes(a), bytes(b)) for a, b in merges]
        self.special_tokens: list[str] = []
        self.special_token_ids: dict[str, int] = {}
        self._add_specials(special_tokens or [])
        specials = set(self.special_token_ids.values())
        self._ids: dict[bytes, int] = {}
        for i, t in sorted(self.vocab.items()):
            if i not in specials and self._ids.setdefault(t, i) != i:
                raise ValueError(f"vocab ids {self._ids[t]} and {i} both hold {t!r}; ordinary tokens must be unique")
        missing = [b for b in range(256) if bytes([b]) not in self._ids]
        if missing:
            raise ValueError(f"vocab lacks single-byte tokens {missing[:8]}...; byte-level BPE needs all 256 bytes")
        self._byte_ids = [self._ids[bytes([b])] for b in range(256)]
        self._merges = _merge_table(self.merges, self._ids)
        self._table: list[bytes | None] = [None] * self.vocab_size
        for i, t in self.vocab.items():
            self._table[i] = t
        self._special_re = special_regex(self.special_tokens)
        self._cache: dict[str, list[int]] = {}
        self.impl = impl
        self._fast = None
        if impl == "tiktoken":
            from scratchlm.tokenizer.fast import tiktoken_encoding

            self._fast = tiktoken_encoding(self)

    def _add_specials(self, special_tokens: list[str]) -> None:
        by_bytes = {t: i for i, t in sorted(self.vocab.items(), reverse=True)}
        for s in special_tokens:
            if not isinstance(s, str) or not s:
                raise ValueError(f"special token {s!r} must be a non-empty string (e.g. '<|endoftext|>')")
            if s in self.special_token_ids:
                continue
            i = by_bytes.get(s.encode("utf-8"))
            if i is None:
                i = max(self.vocab, default=-1) + 1
                self.vocab[i] = s.encode("utf-8")
            self.special_tokens.append(s)
            self.special_token_ids[s] = i

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (the embedding rows a model needs)."""
        return max(self.vocab) + 1

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, specials={self.special_tokens}, impl={self.impl!r})"

    # -- encoding ----------------------------------------------------------------------------
    def encode_word(self, word: str) -> list[int]:
        """BPE of one pre-token (reference algorithm, see module docstring). A lone surrogate (not
        encodable as UTF-8) becomes U+FFFD first, as tiktoken does."""
        try:
            data = word.encode("utf-8")
        except UnicodeEncodeError:
            data = word.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
        ids = [self._byte_ids[b] for b in data]
        merges = self._merges
        while len(ids) > 1:
            best = None
            for pair in zip(ids, ids[1:]):
                hit = merges.get(pair)
                if hit is not None and (best is None or hit < best):
                    best, a, b = hit, pair[0], pair[1]
            if best is None:
                break
            out, i, n = [], 0, len(ids)
            while i < n:
                if ids[i] == a and i + 1 < n and ids[i + 1] == b:
                    out.append(best[1])
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text treating special-token strings as plain text."""
        if self._fast is not None:
            return self._fast.encode_ordinary(text)
        cache, out = self._cache, []
        for word in pretokenize(text):
            ids = cache.get(word)
            if ids is None:
                ids = self.encode_word(word)
                if len(cache) >= CACHE_ENTRIES:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
        return out

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special tokens in the text map to their ids (longest match first)."""
        if not isinstance(text, str):
            raise ValueError(f"encode expects str, got {type(text).__name__}; decode bytes with .decode('utf-8') first")
        if self._special_re is None or not any(s in text for s in self.special_tokens):
            return self.encode_ordinary(text)  # common case: skip the special-token scan
        out: list[int] = []
        for piece, is_special in split_on_specials(text, self._special_re):
            if is_special:
                out.append(self.special_token_ids[piece])
            else:
                out.extend(self.encode_ordinary(piece))
        return out

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Lazily encode a stream of strings (e.g. a file's lines) as one text, in constant memory."""
        from scratchlm.tokenizer.streaming import encode_stream

        return encode_stream(self, iterable)

    # -- decoding ----------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated token bytes; ValueError naming any id outside the vocab."""
        ids = [int(i) for i in ids]
        table = self._table
        try:
            if ids and min(ids) < 0:
                raise IndexError
            return b"".join([table[i] for i in ids])
        except (IndexError, TypeError):
            bad = next(i for i in ids if not 0 <= i < len(table) or table[i] is None)
            raise ValueError(
                f"token id {bad} is not in the vocabulary (vocab_size {self.vocab_size}); "
                "were these ids made by another tokenizer?"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; bytes that are not valid UTF-8 (e.g. a cut multi-byte char) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # -- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write our readable format into `directory` (see `scratchlm.tokenizer.formats`)."""
        from scratchlm.tokenizer.formats import save_tokenizer

        save_tokenizer(self, directory)

    @classmethod
    def load(cls, directory: str | Path, *, impl: str = "reference") -> "Tokenizer":
        """Read a tokenizer saved by `save` (works on a model directory holding it)."""
        from scratchlm.tokenizer.formats import load_tokenizer

        return load_tokenizer(directory, impl=impl)
