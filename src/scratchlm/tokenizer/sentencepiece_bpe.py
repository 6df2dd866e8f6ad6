"""The SentencePiece-BPE model by scores: one fragment of text -> token ids, from scratch.

This is how llama.cpp tokenizes a GGUF "llama" (SentencePiece) vocabulary (`llm_tokenizer_spm_session`,
src/llama-vocab.cpp). There are no merge rules, only a score per token:

    symbols = the fragment's chars (a char need not be a token)
    repeat: among adjacent symbols (a, b) whose text a + b is a token (of any type), merge the pair whose
            token has the highest score, the leftmost pair among equal scores; stop when none is left
    each symbol -> its token id; a char that is not a token -> the "<0xNN>" tokens of its UTF-8 bytes

The loop is a max-heap of (score, left position) over a linked list of symbols; an entry is stale once its
left symbol died or its right neighbour grew, so a fragment of n chars costs O(n log n). The whole
fragment is one "word" (SentencePiece has no pre-tokenizer), so results are cached per fragment.

How it differs from the BPE model (bpe.py): a pair merges because its text is a token, not because a merge
rule lists it; a char that is not a token still merges with a neighbour when the two make a token; byte
fallback happens at the end, not before merging; equal scores go to the leftmost pair. `to_json` writes the
BPE form that HF `tokenizers` loads (merges derived from the scores, score_merges.py); `hf_form_risks` says
whether that form can tokenize some text differently.
"""

from __future__ import annotations

import heapq
import math

from scratchlm.tokenizer.byte_fallback import byte_token
from scratchlm.tokenizer.score_merges import bpe_form_risks, merges_from_scores

CACHE_ENTRIES = 1 << 12  # bounded fragment -> tokens cache (cleared when full)
Tokens = tuple[list[int], list[tuple[int, int]]]  # ids, and each token's (start, end) chars in the fragment


class SentencePieceBPE:
    """Tokens by id and their scores (module docstring). `unk_token` is only written to the BPE form."""

    def __init__(self, tokens: list[str], scores: list[float], *, unk_token: str | None = None) -> None:
        if len(scores) != len(tokens):
            raise ValueError(f"{len(scores)} scores for {len(tokens)} tokens; SentencePiece-BPE needs one score per token")
        self.vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if not isinstance(t, str) or not t:
                raise ValueError(f"token {i} is {t!r}; tokens must be non-empty strings")
            if self.vocab.setdefault(t, i) != i:
                raise ValueError(f"tokens {self.vocab[t]} and {i} are both {t!r}; token texts must be unique")
        self.scores = [float(s) for s in scores]
        bad = next((i for i, s in enumerate(self.scores) if math.isnan(s)), None)
        if bad is not None:
            raise ValueError(f"the score of token {bad} ({tokens[bad]!r}) is NaN; scores must be numbers")
        self.tokens = list(tokens)
        self.vocab_r = dict(enumerate(self.tokens))
        self.unk_token = unk_token
        self._merges: list[tuple[str, str]] | None = None
        self._cache: dict[str, Tokens] = {}

    @property
    def merges(self) -> list[tuple[str, str]]:
        """The merges of the BPE form (score_merges.merges_from_scores), built on first use."""
        if self._merges is None:
            self._merges = merges_from_scores(self.tokens, self.scores)
        return self._merges

    def to_json(self) -> dict:
        """The BPE form of this model, as HF tokenizer.json writes a converted SentencePiece model."""
        return {"type": "BPE", "dropout": None, "unk_token": self.unk_token, "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                "vocab": dict(self.vocab), "merges": [[a, b] for a, b in self.merges]}

    def hf_form_risks(self) -> list[str]:
        """Why the BPE form (to_json) may tokenize some text differently (score_merges.bpe_form_risks)."""
        return bpe_form_risks(self.tokens, self.scores)

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- encoding -----------------------------------------------------------------------------
    def tokenize(self, word: str) -> Tokens:
        """(ids, char spans within `word`) of one fragment; cached."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        for start, end in self.symbols(word):
            tid = self.vocab.get(word[start:end])
            if tid is not None:
                ids.append(tid)
                spans.append((start, end))
                continue
            fallback = self._byte_ids(word[start:end])  # merged symbols are tokens: this is one char
            ids.extend(fallback)
            spans.extend([(start, end)] * len(fallback))
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[word] = (ids, spans)
        return ids, spans

    def symbols(self, word: str) -> list[tuple[int, int]]:
        """The (start, end) char spans of the symbols left when no adjacent pair makes a token."""
        n = len(word)
        end = list(range(1, n + 1))  # symbol starting at char i covers word[i:end[i]] while alive
        nxt = list(range(1, n)) + [-1] if n else []
        prv = list(range(-1, n - 1))
        alive = [True] * n
        vocab, scores = self.vocab, self.scores
        heap = []
        for i in range(n - 1):
            tid = vocab.get(word[i:i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, i + 2))
        heapq.heapify(heap)
        while heap:
            _, i, stop = heapq.heappop(heap)
            j = nxt[i] if alive[i] else -1
            if j == -1 or end[j] != stop:
                continue  # stale: i was merged away, or its right neighbour changed since the push
            end[i] = stop
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] != -1:
                prv[nxt[j]] = i
            for left in (prv[i], i):
                right = nxt[left] if left != -1 else -1
                if right != -1 and (tid := vocab.get(word[left:end[right]])) is not None:
                    heapq.heappush(heap, (-scores[tid], left, end[right]))
        return [(i, end[i]) for i in range(n) if alive[i]]

    def _byte_ids(self, ch: str) -> list[int]:
        """The "<0xNN>" ids of a char that is not a token (llama.cpp aborts where one is missing)."""
        out = []
        for b in ch.encode("utf-8"):
            tid = self.vocab.get(byte_token(b))
            if tid is None:
                raise ValueError(f"char {ch!r} is not in the vocabulary and neither is the byte token {byte_token(b)} "
                                 "of its UTF-8 bytes; this vocabulary cannot encode it (llama.cpp aborts on it)")
            out.append(tid)
        return out

    # -- ids <-> strings ----------------------------------------------------------------------
    def id_to_token(self, i: int) -> str | None:
        return self.vocab_r.get(i)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)
