"""Byte-level BPE training from scratch, with incremental pair counts.

    vocab  = 256 single bytes (id = byte value), then the special tokens, then one token per merge
    repeat: (a, b) = argmax over adjacent pairs of count(a, b) = sum of word frequencies,
            ties -> the lexicographically greater pair (compared as bytes);
            merge every occurrence of (a, b) into the token a+b
    until len(vocab) == vocab_size.

After a merge only the words that contain (a, b) are touched: their old pairs are subtracted and their
new pairs added (a pair -> words index says which words), and the changed counts are pushed onto a
max-heap with lazy deletion, so no step recounts the corpus.
"""

from __future__ import annotations

import heapq
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from scratchlm.tokenizer.training.corpus_chunks import count_pretokens

Pair = tuple[int, int]


def desc_key(token: bytes) -> tuple[int, ...]:
    """A key that sorts byte strings in DEscending order: 255 - b per byte, then 256 as terminator.

    key(x) < key(y)  <=>  x > y  (so a longer string beats its own prefix)."""
    return tuple(255 - b for b in token) + (256,)


def validate_specials(special_tokens: Iterable[str] | None) -> list[str]:
    """De-duplicated specials in order; ValueError for a non-string or empty one."""
    out: list[str] = []
    for s in special_tokens or []:
        if not isinstance(s, str) or not s:
            raise ValueError(f"special token {s!r} must be a non-empty string (e.g. '<|endoftext|>')")
        if s not in out:
            out.append(s)
    return out


def _input_paths(input_path: str | Path | Iterable[str | Path]) -> list[Path]:
    paths = [Path(input_path)] if isinstance(input_path, (str, Path)) else [Path(p) for p in input_path]
    if not paths:
        raise ValueError("no input files given; pass at least one text file")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"training input {p} does not exist or is not a file")
    return paths


def train_bpe(
    input_path: str | Path | Iterable[str | Path],
    vocab_size: int,
    special_tokens: list[str] | None = None,
    *,
    num_workers: int | None = None,
    chunk_bytes: int | None = None,
    errors: str = "strict",
    progress: bool = False,
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE on one or more UTF-8 text files; returns (vocab, merges in rank order).

    `errors` is passed to UTF-8 decoding ("strict" raises naming the byte offset; "replace" maps bad
    bytes to U+FFFD). `num_workers` processes pre-tokenize chunks of about `chunk_bytes` bytes."""
    paths = _input_paths(input_path)
    specials = validate_specials(special_tokens)
    floor = 256 + len(specials)
    if not isinstance(vocab_size, int) or vocab_size <= floor:
        raise ValueError(
            f"vocab_size {vocab_size} must be greater than 256 bytes + {len(specials)} special tokens = {floor}; "
            f"pass e.g. --vocab-size {max(floor + 1, 4096)}"
        )
    if errors not in ("strict", "replace", "ignore"):
        raise ValueError(f"errors={errors!r} is not one of 'strict', 'replace', 'ignore'")
    counts = count_pretokens(
        paths, tuple(specials), num_workers=num_workers, chunk_bytes=chunk_bytes, errors=errors, progress=progress
    )
    if not counts:
        raise ValueError(f"corpus {', '.join(map(str, paths))} is empty (no text outside special tokens); nothing to train on")
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    for k, s in enumerate(specials):
        vocab[256 + k] = s.encode("utf-8")
    merges = merge_loop(counts, vocab, vocab_size, n_specials=len(specials), progress=progress)
    if len(vocab) < vocab_size:
        warnings.warn(
            f"corpus ran out of pairs to merge: vocab has {len(vocab)} tokens, fewer than vocab_size {vocab_size}",
            stacklevel=2,
        )
    return vocab, merges


def _pair_index(words: list[list[int]], freqs: list[int]) -> tuple[dict[Pair, int], dict[Pair, set[int]]]:
    """Initial count(a, b) = sum of freq over occurrences, and pair -> indices of words holding it."""
    counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)
    for wi, w in enumerate(words):
        f = freqs[wi]
        for p in zip(w, w[1:]):
            counts[p] += f
            where[p].add(wi)
    return counts, where


def find_pair(w: list[int], a: int, b: int) -> list[int]:
    """Start positions of the non-overlapping occurrences of (a, b) in w, scanning left to right."""
    occ: list[int] = []
    i, last = 0, len(w) - 1
    try:
        while True:
            i = w.index(a, i)
            if i < last and w[i + 1] == b:
                occ.append(i)
                i += 2
            else:
                i += 1
    except ValueError:
        return occ


def merge_word(w: list[int], occ: list[int], new: int) -> list[int]:
    """w with the pairs starting at `occ` replaced by `new`."""
    out: list[int] = []
    j = 0
    for i in occ:
        out.extend(w[j:i])
        out.append(new)
        j = i + 2
    out.extend(w[j:])
    return out


def _word_delta(w: list[int], occ: list[int], new: int, f: int, delta: dict[Pair, int], added: list[Pair]) -> None:
    """Pair-count changes of one word (frequency f) when (a, b) at `occ` becomes `new`.

    Only pairs touching a merged position change: (left, a) -> (left', new) and (b, right) ->
    (new, right); when two occurrences are adjacent the pair between them, (b, a), becomes (new, new)."""
    a, b = w[occ[0]], w[occ[0] + 1]
    n, last = len(w), len(occ) - 1
    for k, i in enumerate(occ):
        if i > 0:
            left = w[i - 1]
            delta[(left, a)] -= f
            p = (new if k > 0 and occ[k - 1] == i - 2 else left, new)
            delta[p] += f
            added.append(p)
        if i + 2 < n and not (k < last and occ[k + 1] == i + 2):
            right = w[i + 2]
            delta[(b, right)] -= f
            p = (new, right)
            delta[p] += f
            added.append(p)


def apply_merge(
    pair: Pair, new: int, words: list[list[int]], freqs: list[int], counts: dict[Pair, int], where: dict[Pair, set[int]]
) -> dict[Pair, int]:
    """Merge `pair` -> `new` in every word holding it; update counts/where; return the changed counts."""
    a, b = pair
    delta: dict[Pair, int] = defaultdict(int)
    for wi in where.pop(pair, ()):
        w = words[wi]
        occ = find_pair(w, a, b)
        if not occ:  # stale index entry: the pair left this word in an earlier merge
            continue
        added: list[Pair] = []
        _word_delta(w, occ, new, freqs[wi], delta, added)
        for p in added:
            where[p].add(wi)
        words[wi] = merge_word(w, occ, new)
    counts.pop(pair, None)
    delta.pop(pair, None)  # left-to-right merging leaves no (a, b) behind, even when a == b
    changed: dict[Pair, int] = {}
    for p, d in delta.items():
        if d:
            c = counts.get(p, 0) + d
            changed[p] = c
            if c:
                counts[p] = c
            else:
                del counts[p]
                where.pop(p, None)
    return changed


def merge_loop(
    word_counts: dict[bytes, int], vocab: dict[int, bytes], vocab_size: int, *, n_specials: int = 0, progress: bool = False
) -> list[tuple[bytes, bytes]]:
    """Run merges until `vocab` (updated in place) has `vocab_size` tokens; returns the merges.

    A merge whose result already is a token (reached by another split) reuses its id, as HF does."""
    words = [list(w) for w in word_counts]
    freqs = list(word_counts.values())
    counts, where = _pair_index(words, freqs)
    keys = {i: desc_key(t) for i, t in vocab.items()}
    heap = [(-c, keys[a] + keys[b], a, b) for (a, b), c in counts.items()]
    heapq.heapify(heap)
    token_id = {t: i for i, t in vocab.items() if not 256 <= i < 256 + n_specials}
    merges: list[tuple[bytes, bytes]] = []
    with tqdm(total=vocab_size - len(vocab), desc="merges", disable=not progress) as bar:
        while len(vocab) < vocab_size and heap:
            neg, _, a, b = heapq.heappop(heap)
            if counts.get((a, b)) != -neg:
                continue  # stale heap entry
            merged = vocab[a] + vocab[b]
            new = token_id.get(merged)
            if new is None:
                new = len(vocab)
                vocab[new], token_id[merged], keys[new] = merged, new, desc_key(merged)
                bar.update(1)
            merges.append((vocab[a], vocab[b]))
            for (x, y), c in apply_merge((a, b), new, words, freqs, counts, where).items():
                if c:
                    heapq.heappush(heap, (-c, keys[x] + keys[y], x, y))
    return merges
