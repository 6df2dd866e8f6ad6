"""Merges from SentencePiece scores, and when a BPE with those merges tokenizes like SentencePiece-BPE.

A tokenizer.json cannot hold scores, so a SentencePiece vocabulary is written as a BPE whose merges are
derived from them (HF transformers' `generate_merges`, used by its converters and GGUF loader):

    every split T = l + r (at a char boundary) of a token T with l and r tokens is a merge (l, r);
    ranked by score(T) descending, then len(l) descending, then len(r) descending
    (ties in token-id order, then by the ids of l and r).

That BPE (lowest rank first, leftmost on equal rank) gives the same ids as SentencePiece-BPE by scores
(sentencepiece_bpe.py: highest score first, leftmost on equal score) on every text when

  T1  no two different tokens that merges can build share a score — except one "run group": all the
      tokens c^2 .. c^K of one char c at one score (the 15 whitespace runs of Llama-2 / Mistral at -1e9),
      which merge only with each other and which the simulation below shows grow from the left in both;
  T3  no token joins a char that is not a token to a neighbour (SentencePiece keeps such a char as a
      symbol that can merge; the BPE turns it into byte tokens first), and no token has a byte token
      "<0xNN>" as a part (the BPE's fallback bytes could merge, SentencePiece's never exist as symbols);
  T4  every byte a text can need has its "<0xNN>" token (else the BPE emits unk where SentencePiece fails).

Why these suffice: with distinct scores the best candidate pairs at any step are occurrences of one token
T, and they all use the same split: an occurrence of T whose two symbols are still to be merged was cut
off from its neighbours all along, so its symbols are a state of the same deterministic run on T's text
alone, which has one state with two symbols. Then both algorithms merge the leftmost occurrence of the
same pair (ranks follow scores), step by step. Tokens containing a real space are left out: the text is
escaped (" " -> "▁") before merging, so merges never reach them.
"""

from __future__ import annotations

from collections import defaultdict

from scratchlm.tokenizer.byte_fallback import byte_token

RUN_CHECK_FACTOR = 4  # run groups are simulated on runs of up to 4 * K + 4 chars (K: the longest run token)
EXAMPLES = 4


def _splits(token: str, vocab: dict[str, int]) -> list[tuple[str, str]]:
    return [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The merges (l, r) of the BPE form, best first (module docstring; HF's `generate_merges`)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    out = []
    for i, t in enumerate(tokens):
        local = sorted(_splits(t, vocab), key=lambda m: (vocab[m[0]], vocab[m[1]]))
        out.extend((scores[i], left, right) for left, right in local)
    out.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)  # stable, as HF's
    return [(left, right) for _, left, right in out]


def _run_merges(lengths: set[int], n: int, leftmost: bool) -> list[int]:
    """Block sizes a run of n equal chars ends in when the tokens c^k (k in lengths) tie: merge the leftmost
    pair (SentencePiece) or the pair with the longest left, then right part (the BPE form's ranks)."""
    blocks = [1] * n
    while True:
        pairs = [(-blocks[i], -blocks[i + 1], i) for i in range(len(blocks) - 1)
                 if blocks[i] + blocks[i + 1] in lengths]
        if not pairs:
            return blocks
        i = pairs[0][2] if leftmost else min(pairs)[2]
        blocks[i:i + 2] = [blocks[i] + blocks[i + 1]]


def _run_group_ok(group: list[str], tokens: list[str], vocab: dict[str, int], used_by: dict[str, set[str]]) -> bool:
    """True for a tie group that is all the runs c^2 .. c^K of one char c, used as parts only by each other,
    whose runs end in the same blocks both ways (checked up to RUN_CHECK_FACTOR * K + 4 chars)."""
    c = group[0][0]
    if c not in vocab or any(set(t) != {c} for t in group):
        return False
    lengths = {len(t) for t in tokens if set(t) == {c}}
    if lengths != {1} | {len(t) for t in group}:
        return False  # a run token with another score
    members = set(group)
    if any(not used_by.get(t, set()) <= members for t in group):
        return False  # some other token is built from a run
    top = max(lengths)
    return all(_run_merges(lengths, n, True) == _run_merges(lengths, n, False)
               for n in range(2, RUN_CHECK_FACTOR * top + 5))


def _tie_risks(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[str]:
    """T1: different tokens that merges can build (tokens without a real space) with the same score."""
    by_score: dict[float, list[str]] = defaultdict(list)
    used_by: dict[str, set[str]] = defaultdict(set)  # token -> the tokens it is a split part of
    for t in tokens:
        if " " in t or len(t) < 2:
            continue
        splits = _splits(t, vocab)
        if splits:
            by_score[scores[vocab[t]]].append(t)
        for pair in splits:
            for p in pair:
                used_by[p].add(t)
    out = []
    for s, group in by_score.items():
        if len(group) > 1 and not _run_group_ok(group, tokens, vocab, used_by):
            out.append(f"T1: {len(group)} tokens that merges can build share the score {s} (e.g. "
                       f"{group[:EXAMPLES]}): SentencePiece breaks the tie by position, the BPE form by a fixed order")
    return out


def _char_risks(tokens: list[str], vocab: dict[str, int]) -> list[str]:
    """T3: tokens that join a non-token char to a neighbour, tokens with a byte token as a part."""
    def symbol(p: str) -> bool:  # a SentencePiece symbol: a token, or a single char
        return p in vocab or len(p) == 1

    joined, via_bytes = [], []
    byte_texts = {byte_token(b) for b in range(256)}
    for t in tokens:
        if " " in t or len(t) < 2:
            continue
        cuts = [(t[:k], t[k:]) for k in range(1, len(t))]
        if any(symbol(a) and symbol(b) and not (a in vocab and b in vocab) for a, b in cuts):
            joined.append(t)
        if any((a in byte_texts or b in byte_texts) and a in vocab and b in vocab for a, b in cuts):
            via_bytes.append(t)
    out = []
    if joined:
        out.append(f"T3: {len(joined)} tokens join a char that is not a token (e.g. {joined[:EXAMPLES]}): "
                   "SentencePiece merges such a char, the BPE form spells it in byte tokens first")
    if via_bytes:
        out.append(f"T3: {len(via_bytes)} tokens have a byte token as a part (e.g. {via_bytes[:EXAMPLES]}): the BPE "
                   "form can merge fallback bytes, SentencePiece cannot")
    return out


def needed_bytes(vocab: dict[str, int]) -> list[int]:
    """Bytes some text may need as "<0xNN>" tokens that the vocab lacks: UTF-8 lead/continuation bytes, and
    ASCII bytes whose char is not a token."""
    valid = [*range(0x80, 0xC0), *range(0xC2, 0xF5), *(b for b in range(0x80) if chr(b) not in vocab)]
    return sorted(b for b in valid if byte_token(b) not in vocab)


def bpe_form_risks(tokens: list[str], scores: list[float]) -> list[str]:
    """Why the BPE form (merges_from_scores) may tokenize a text differently from SentencePiece-BPE by scores
    (module docstring: T1, T3, T4); [] when it gives the same ids on every text."""
    vocab = {t: i for i, t in enumerate(tokens)}
    out = _tie_risks(tokens, scores, vocab) + _char_risks(tokens, vocab)
    missing = needed_bytes(vocab)
    if missing:
        out.append(f"T4: {len(missing)} bytes have no <0xNN> token (e.g. {[byte_token(b) for b in missing[:EXAMPLES]]}): "
                   "the BPE form emits its unk token where SentencePiece-BPE (and llama.cpp) cannot encode the text")
    return out
