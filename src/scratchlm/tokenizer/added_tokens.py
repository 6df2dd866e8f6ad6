"""Added tokens: strings cut out of the text before anything else and mapped straight to their ids.

Matching, as HF's AddedVocabulary does it (two passes):
  1. on the raw text, tokens with normalized=False; 2. after normalizing the rest, tokens with
     normalized=True (matched in their normalized form).
In each pass the leftmost, then longest, occurrence wins, scanning left to right without overlaps.
Flags of a match:
    single_word  only when not glued to a word char on either side (else the text stays text)
    lstrip       also swallow the whitespace before it;  rstrip  ... and after it
    special      skipped by decode(skip_special_tokens=True), and treated as text by
                 encode_ordinary (HF's `encode_special_tokens=True`); non-special added tokens are
                 always matched
GGUF vocabularies run through llama.cpp's own matcher instead (LongestFirstVocabulary below): the tokens
one at a time, longest first, each cutting every occurrence out of the text still left. The two differ only
when token texts overlap or nest (`hf_form_risks`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import regex

from scratchlm.tokenizer.json_fields import UnsupportedTokenizerFeature, check_fields
from scratchlm.tokenizer.normalized import NormalizedText
from scratchlm.tokenizer.unicode_props import NEWER_THAN_ONIG, WORD_CLASS, count_leading, is_whitespace

_WORD = regex.compile(WORD_CLASS)


def _is_word_char(ch: str) -> bool:
    """A word char as HF's regex engine sees it (chars newer than its tables are not)."""
    return _WORD.match(ch) is not None and NEWER_THAN_ONIG.match(ch) is None


@dataclass(frozen=True)
class AddedToken:
    """One entry of tokenizer.json's "added_tokens" (flags as HF names them)."""

    content: str
    id: int
    special: bool = True
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False

    @classmethod
    def from_json(cls, d: dict, where: str) -> "AddedToken":
        check_fields(d, where, ("id", "content"), ("single_word", "lstrip", "rstrip", "normalized", "special"))
        if not isinstance(d["content"], str) or not d["content"]:
            raise ValueError(f"{where}: content {d['content']!r} must be a non-empty string")
        special = bool(d.get("special", False))
        return cls(d["content"], int(d["id"]), special, bool(d.get("single_word", False)), bool(d.get("lstrip", False)),
                   bool(d.get("rstrip", False)), bool(d.get("normalized", not special)))

    def to_json(self) -> dict:
        return {"id": self.id, "content": self.content, "single_word": self.single_word, "lstrip": self.lstrip,
                "rstrip": self.rstrip, "normalized": self.normalized, "special": self.special}


def assign_ids(tokens: list[AddedToken], model_vocab: dict[str, int]) -> list[AddedToken]:
    """Ids as HF gives them when it reads tokenizer.json: the model vocab's id for a token it holds, else
    the next id from len(model vocab) on, in file order (a file's own ids are only checked by HF, which
    warns when they differ). A repeated content keeps its first id."""
    out, seen = [], {}
    next_id = len(model_vocab)
    for t in tokens:
        tid = seen.get(t.content, model_vocab.get(t.content))
        if tid is None:
            tid, next_id = next_id, next_id + 1
        seen.setdefault(t.content, tid)
        if tid != t.id:
            warnings.warn(f"added token {t.content!r} is listed with id {t.id} but gets id {tid} (HF tokenizers "
                          "assigns it the same way); the tokenizer.json is inconsistent", stacklevel=4)
            t = dataclasses.replace(t, id=tid)
        out.append(t)
    return out


Piece = tuple[NormalizedText, int | None]  # text still to tokenize (id None), or a matched added token


class AddedVocabulary:
    """The added tokens and their two matchers (see module docstring)."""

    def __init__(self, tokens: list[AddedToken], normalizer=None) -> None:
        self.tokens = sorted(tokens, key=lambda t: t.id)
        self.by_id = {t.id: t for t in self.tokens}
        self.by_content = {t.content: t for t in self.tokens}
        self.special_ids = frozenset(t.id for t in self.tokens if t.special)
        # a normalized token is matched in its normalized form (HF's normalized_cache)
        self.pattern_of = {t.id: (normalizer.normalize(NormalizedText(t.content)).text if t.normalized and normalizer
                                  else t.content) for t in self.tokens}
        self._build_matchers()

    def _build_matchers(self) -> None:
        self._raw = self._matcher([t for t in self.tokens if not t.normalized])
        self._norm = self._matcher([t for t in self.tokens if t.normalized])

    def _matcher(self, tokens: list[AddedToken]) -> tuple[regex.Pattern, dict[str, AddedToken]] | None:
        if not tokens:
            return None
        by_text = {}
        for t in tokens:
            by_text.setdefault(self.pattern_of[t.id], t)
        ordered = sorted(by_text, key=lambda s: (-len(s), s))  # longest first: leftmost-longest matching
        return regex.compile("|".join(regex.escape(s) for s in ordered)), by_text

    def matcher_regex(self) -> regex.Pattern | None:
        """One regex matching any added token's text (longest first), None without added tokens."""
        texts = sorted(set(self.pattern_of.values()), key=lambda s: (-len(s), s))
        return regex.compile("|".join(regex.escape(s) for s in texts)) if texts else None

    @property
    def max_len(self) -> int:
        return max((len(p) for p in self.pattern_of.values()), default=0)

    def split(self, nt: NormalizedText, normalized: bool, skip_special: bool) -> list[Piece]:
        """Cut `nt` at the matches of one pass (normalized=False: raw tokens; True: normalized ones)."""
        matcher = self._norm if normalized else self._raw
        text = nt.text
        if matcher is None or not text:
            return [(nt, None)] if text else []
        rx, by_text = matcher
        out: list[Piece] = []
        done = 0
        for m in rx.finditer(text):
            tok = by_text[m.group()]
            start, stop = m.span()
            if skip_special and tok.special:
                continue
            if tok.single_word and not self._alone(text, start, stop):
                continue
            if tok.lstrip:
                start = max(start - count_leading(reversed(text[:start]), is_whitespace), done)
            if tok.rstrip:
                stop += count_leading(text[stop:], is_whitespace)
            start = max(start, done)
            if start > done:
                out.append((nt.slice(done, start), None))
            out.append((nt.slice(start, stop), tok.id))
            done = stop
        if done < len(text):
            out.append((nt.slice(done, len(text)), None))
        return out

    @staticmethod
    def _alone(text: str, start: int, stop: int) -> bool:
        before = start == 0 or not _is_word_char(text[start - 1])
        after = stop == len(text) or not _is_word_char(text[stop])
        return before and after

    def to_json(self) -> list[dict]:
        return [t.to_json() for t in self.tokens]


C_SPACE = " \t\n\v\f\r"  # what C's isspace() accepts: llama.cpp's lstrip / rstrip whitespace
EXAMPLES = 4


class LongestFirstVocabulary(AddedVocabulary):
    """llama.cpp's partition of a text by its special tokens (`tokenizer_st_partition`, src/llama-vocab.cpp):

        for each token, longest UTF-8 text first (llama.cpp leaves equal lengths unordered; here by id):
            for each piece still text: cut out every occurrence, leftmost first, without overlaps
    lstrip / rstrip drop the C-isspace chars (" \\t\\n\\v\\f\\r") before / after an occurrence from the
    neighbouring text (the token's span covers them). skip_special leaves special tokens out altogether, so a
    non-special token inside a special token's text is still found (HF's matcher would have consumed it).
    Only raw matching: single_word and normalized tokens are refused."""

    def __init__(self, tokens: list[AddedToken], normalizer=None) -> None:
        odd = [t.content for t in tokens if t.single_word or t.normalized]
        if odd:
            raise UnsupportedTokenizerFeature(f"added tokens {odd[:EXAMPLES]} are single_word or normalized; llama.cpp's "
                                              "longest-first matching matches raw text only")
        super().__init__(tokens, normalizer)
        order = sorted(self.tokens, key=lambda t: (-len(t.content.encode("utf-8")), t.id))
        self._by_head: dict[str, list[tuple[int, AddedToken]]] = {}  # first two chars -> (rank, token)
        for rank, t in enumerate(order):
            self._by_head.setdefault(t.content[:2], []).append((rank, t))

    def _build_matchers(self) -> None:
        self._raw = self._norm = None  # split() below needs no regex (large vocabularies compile slowly)

    def _candidates(self, text: str) -> list[AddedToken]:
        """The tokens in `text`, in matching order (found through their first two chars)."""
        heads = set(text) | {text[i:i + 2] for i in range(len(text) - 1)}
        hits = [h for head in heads for h in self._by_head.get(head, ())]
        return [t for _, t in sorted(hits, key=lambda h: h[0]) if t.content in text]

    def split(self, nt: NormalizedText, normalized: bool, skip_special: bool) -> list[Piece]:
        if normalized or not nt.text:
            return [(nt, None)] if nt.text else []
        pieces: list[Piece] = [(nt, None)]
        for tok in self._candidates(nt.text):
            if skip_special and tok.special:
                continue
            cut: list[Piece] = []
            for piece, tid in pieces:
                cut.extend([(piece, tid)] if tid is not None else self._cut(piece, tok))
            pieces = cut
        return pieces

    @staticmethod
    def _cut(nt: NormalizedText, tok: AddedToken) -> list[Piece]:
        text, content, out, done = nt.text, tok.content, [], 0
        while (at := text.find(content, done)) >= 0:
            start, stop = at, at + len(content)
            while tok.lstrip and start > done and text[start - 1] in C_SPACE:
                start -= 1
            while tok.rstrip and stop < len(text) and text[stop] in C_SPACE:
                stop += 1
            if start > done:
                out.append((nt.slice(done, start), None))
            out.append((nt.slice(start, stop), tok.id))
            done = stop
        if done < len(text):
            out.append((nt.slice(done, len(text)), None))
        return out

    def hf_form_risks(self) -> list[str]:
        """Why HF's leftmost-longest matching (AddedVocabulary) may cut a text differently (module docstring)."""
        texts = {t.content: t for t in self.tokens}
        prefixes: dict[str, list[str]] = {}
        for c in texts:
            for k in range(1, len(c)):
                prefixes.setdefault(c[:k], []).append(c)
        overlap, nested = [], []
        for c, tok in texts.items():
            overlap += [(c, b) for k in range(1, len(c)) for b in prefixes.get(c[k:], [])
                        if b != c and len(set(c + b)) > 1]  # runs of one char cut greedily from the left in both
            inner = {c[i:j] for i in range(len(c)) for j in range(i + 1, len(c) + 1)} - {c}
            nested += [(c, x) for x in inner if x in texts and tok.special and not texts[x].special]
        out = []
        if overlap:
            out.append(f"T5: {len(overlap)} pairs of added tokens overlap (e.g. {overlap[:EXAMPLES]}): llama.cpp cuts the "
                       "longer one first, HF the leftmost (llama.cpp orders equal lengths arbitrarily)")
        if nested:
            out.append(f"T5: {len(nested)} non-special added tokens lie inside special ones (e.g. {nested[:EXAMPLES]}): "
                       "without special tokens llama.cpp still finds them, HF does not")
        stripping = [t.content for t in self.tokens if t.lstrip or t.rstrip]
        if stripping:
            out.append(f"T6: {len(stripping)} added tokens strip whitespace (e.g. {stripping[:EXAMPLES]}): llama.cpp strips "
                       "only ASCII whitespace (C isspace), HF all Unicode White_Space")
        return out


MATCHING = {"leftmost_longest": AddedVocabulary, "longest_first": LongestFirstVocabulary}
