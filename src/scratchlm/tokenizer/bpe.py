"""The BPE model: one pre-token (a string) -> token ids, from scratch.

    symbols = one per char: vocab[c]  (vocab["##" + c] for non-first chars with a continuing_subword_prefix,
              vocab[c + "</w>"] for the last char with an end_of_word_suffix);
              a char not in the vocab -> its "<0xNN>" byte tokens (byte_fallback), else unk_token
              (consecutive unknown chars fused into one unk with fuse_unk), else it is dropped
    repeat: among adjacent pairs (a, b) listed in merges take the lowest rank (leftmost on ties),
            replace it by vocab[a + b]; stop when no adjacent pair is a merge.
    ignore_merges: a pre-token that is itself in the vocab is that one token (Llama-3).

The merge loop is HF's: a min-heap of (rank, position) over a linked list of symbols, so a long
pre-token (SentencePiece-style tokenizers make the whole text one pre-token) costs O(n log n).
"""

from __future__ import annotations

import heapq

from scratchlm.tokenizer.byte_fallback import fallback_ids
from scratchlm.tokenizer.json_fields import UnsupportedTokenizerFeature, check_fields

CACHE_ENTRIES = 1 << 14  # bounded pre-token -> tokens cache (cleared when full: memory stays constant)
Tokens = tuple[list[int], list[tuple[int, int]]]  # ids, and each token's (start, end) chars in the pre-token
MODEL_FIELDS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                "byte_fallback", "ignore_merges")


def merge_table(vocab: dict[str, int], merges: list[tuple[str, str]], prefix: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(id_a, id_b) -> (rank, id of a + b without b's continuing prefix); a repeated pair keeps its last rank."""
    table: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, (a, b) in enumerate(merges):
        merged = a + b[len(prefix):]
        for part in (a, b, merged):
            if part not in vocab:
                raise ValueError(f"merge #{rank} ({a!r}, {b!r}) uses or makes token {part!r}, which is not in the vocab; "
                                 "the vocab must hold both parts and their concatenation")
        table[(vocab[a], vocab[b])] = (rank, vocab[merged])
    return table


class BPE:
    """The BPE model of tokenizer.json (fields as HF names them; see module docstring)."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], *, unk_token: str | None = None,
                 continuing_subword_prefix: str | None = None, end_of_word_suffix: str | None = None,
                 fuse_unk: bool = False, byte_fallback: bool = False, ignore_merges: bool = False,
                 dropout: float | None = None) -> None:
        if dropout:
            raise UnsupportedTokenizerFeature(f"model.dropout={dropout} (BPE dropout, random merges) is not supported; "
                                              "set it to null for inference")
        self.vocab = vocab
        self.merges = merges
        self.unk_token = unk_token
        self.prefix = continuing_subword_prefix
        self.suffix = end_of_word_suffix
        self.fuse_unk = fuse_unk
        self.byte_fallback = byte_fallback
        self.ignore_merges = ignore_merges
        self.dropout = dropout
        self.vocab_r = {i: s for s, i in vocab.items()}
        if len(self.vocab_r) != len(vocab):
            raise ValueError("model.vocab maps two tokens to the same id; ids must be unique")
        self._merges = merge_table(vocab, merges, continuing_subword_prefix or "")
        self._cache: dict[str, Tokens] = {}

    @classmethod
    def from_json(cls, d: dict, where: str = "model") -> "BPE":
        check_fields(d, where, ("vocab", "merges"), MODEL_FIELDS)
        merges = []
        for n, m in enumerate(d["merges"]):
            parts = m.split(" ") if isinstance(m, str) else m
            if not isinstance(parts, (list, tuple)) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise ValueError(f"{where}.merges[{n}] {m!r} is not a pair of tokens")
            merges.append((parts[0], parts[1]))
        vocab = {str(s): int(i) for s, i in d["vocab"].items()}
        opts = {k: d.get(k) for k in MODEL_FIELDS if d.get(k) is not None}
        return cls(vocab, merges, **opts)

    def to_json(self) -> dict:
        return {"type": "BPE", "dropout": self.dropout, "unk_token": self.unk_token,
                "continuing_subword_prefix": self.prefix, "end_of_word_suffix": self.suffix,
                "fuse_unk": self.fuse_unk, "byte_fallback": self.byte_fallback, "ignore_merges": self.ignore_merges,
                "vocab": {s: i for i, s in sorted(self.vocab_r.items())},
                "merges": [[a, b] for a, b in self.merges]}

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- encoding -----------------------------------------------------------------------------
    def tokenize(self, word: str) -> Tokens:
        """(ids, char spans within `word`) of one pre-token; cached."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if self.ignore_merges and word in self.vocab:
            out: Tokens = ([self.vocab[word]], [(0, len(word))])
        else:
            ids, spans = self._symbols(word)
            out = self._merge(ids, spans)
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[word] = out
        return out

    def merge_symbols(self, word: str) -> list[int]:
        """Ids the merges make of `word` (uncached, ignore_merges not applied)."""
        ids, spans = self._symbols(word)
        return self._merge(ids, spans)[0]

    def _unk_id(self) -> int:
        if self.unk_token not in self.vocab:
            raise ValueError(f"model.unk_token {self.unk_token!r} is not in the model vocab")
        return self.vocab[self.unk_token]

    def _symbols(self, word: str) -> tuple[list[int], list[list[int]]]:
        """Initial symbols: one per char, byte tokens, or unk (HF `merge_word` before merging)."""
        ids: list[int] = []
        spans: list[list[int]] = []
        unk: list[int] | None = None  # [id, start, end] of a pending unk
        last = len(word) - 1
        for i, ch in enumerate(word):
            s = ch
            if i and self.prefix:
                s = self.prefix + s
            if i == last and self.suffix:
                s = s + self.suffix
            tid = self.vocab.get(s)
            if tid is not None:
                if unk is not None:
                    ids.append(unk[0])
                    spans.append(unk[1:])
                    unk = None
                ids.append(tid)
                spans.append([i, i + 1])
                continue
            fb = fallback_ids(s, self.vocab) if self.byte_fallback else None
            if fb is not None:
                ids.extend(fb)
                spans.extend([i, i + 1] for _ in fb)
            elif self.unk_token is not None:
                if unk is not None and self.fuse_unk:
                    unk[2] = i + 1
                    continue
                if unk is not None:
                    ids.append(unk[0])
                    spans.append(unk[1:])
                unk = [self._unk_id(), i, i + 1]
        if unk is not None:
            ids.append(unk[0])
            spans.append(unk[1:])
        return ids, spans

    def _merge(self, ids: list[int], spans: list[list[int]]) -> Tokens:
        """Apply merges lowest rank first, leftmost first among equal ranks (see module docstring)."""
        n = len(ids)
        merges = self._merges
        heap = []
        for i in range(n - 1):
            hit = merges.get((ids[i], ids[i + 1]))
            if hit is not None:
                heap.append((hit[0], i, hit[1]))
        if not heap:
            return ids, [tuple(s) for s in spans]
        heapq.heapify(heap)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        alive = [True] * n
        while heap:
            _, pos, new = heapq.heappop(heap)
            j = nxt[pos]
            if not alive[pos] or j == -1:
                continue
            hit = merges.get((ids[pos], ids[j]))
            if hit is None or hit[1] != new:
                continue  # stale entry: this pair changed since it was pushed
            ids[pos] = new
            spans[pos][1] = spans[j][1]
            alive[j] = False
            nxt[pos] = nxt[j]
            if nxt[j] != -1:
                prv[nxt[j]] = pos
            p, q = prv[pos], nxt[pos]
            if p != -1 and (hit := merges.get((ids[p], new))) is not None:
                heapq.heappush(heap, (hit[0], p, hit[1]))
            if q != -1 and (hit := merges.get((new, ids[q]))) is not None:
                heapq.heappush(heap, (hit[0], pos, hit[1]))
        keep = [k for k in range(n) if alive[k]]
        return [ids[k] for k in keep], [tuple(spans[k]) for k in keep]

    # -- ids <-> strings ----------------------------------------------------------------------
    def id_to_token(self, i: int) -> str | None:
        return self.vocab_r.get(i)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)
