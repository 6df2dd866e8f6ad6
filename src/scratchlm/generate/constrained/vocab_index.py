"""The tokenizer's vocabulary, indexed once for computing token masks fast.

    trie         the ordinary tokens' bytes as a byte trie (byte_trie.py: implicit in the sorted token list).
                 A mask is a walk from the automaton state down the trie that prunes a whole subtree at the
                 first byte the automaton refuses, so structural states (after "{", inside a number, ...)
                 touch only a few hundred trie nodes.
    plain[u]     inside a string almost every token is allowed, and a walk would touch the whole trie. A
                 token made only of string-content bytes (no '"', '\\' or control byte; valid UTF-8
                 when read after the pending continuation u) leaves a string state as it found it (up to
                 the pending continuation), whatever the stack below. plain[u] is that set, as a (V,)
                 bool tensor, one per pending-continuation class u (at most 8), computed on first use.
    quoted[u]    the tokens that reach a '"' or '\\' with only string content before it (ending on a character
                 boundary): the only other tokens a string state may allow. Their content prefix leaves the
                 state as ("str", node, 0, None), so what decides them is the rest from the first quote or
                 backslash on: quoted[u] is a trie of those suffixes, walked like the main trie (a string
                 state's mask costs one pruned walk, however many tokens hold a quote).
    lead_ws      the leading whitespace bytes of every token: a state k whitespace bytes into a gap allows
                 what the same state at 0 allows, minus the tokens whose leading whitespace would pass WS_MAX
                 (so the whitespace counter does not multiply the states whose masks are computed).
Special tokens (chat markers, end of text) are never in the trie: the constraint allows the stop
tokens itself, when the text is complete.
"""

from __future__ import annotations

from typing import Any

import torch

from scratchlm.generate.constrained.byte_trie import ByteTrie
from scratchlm.generate.constrained.json_machine import BACKSLASH, QUOTE, utf8_next
from scratchlm.generate.detokenize import token_bytes

Pending = tuple[int, int, int] | None


def vocabulary_bytes(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """bytes of every ordinary token id < vocab_size; None for special tokens and unused ids."""
    specials = set((getattr(tokenizer, "special_token_ids", None) or {}).values())
    known = getattr(tokenizer, "vocab", None)
    out: list[bytes | None] = [None] * vocab_size
    for i in range(min(vocab_size, getattr(tokenizer, "vocab_size", vocab_size))):
        if i in specials or (isinstance(known, dict) and i not in known):
            continue
        out[i] = token_bytes(tokenizer, i)
    return out


def string_run(pending: Pending, data: bytes) -> Pending | bool:
    """Read `data` as string content after `pending`: the pending continuation at its end, or False as
    soon as a byte is not string content (a quote, backslash, control byte or invalid UTF-8)."""
    for b in data:
        pending = utf8_next(pending, b)
        if pending is False:
            return False
    return pending


class VocabIndex:
    """Token bytes, their trie, and the per-continuation plain/quoted sets (see the module docstring)."""

    def __init__(self, tokens: list[bytes | None]) -> None:
        self.tokens = tokens
        self.size = len(tokens)
        self.trie = ByteTrie([(data, i) for i, data in enumerate(tokens) if data])
        # leading whitespace bytes of each token (all of them for a whitespace-only token)
        self.lead_ws = torch.tensor([len(d) - len(d.lstrip(b" \t\n\r")) if d else 0 for d in tokens], dtype=torch.long)
        self._plain: dict[Pending, torch.Tensor] = {}
        self._tail: dict[Pending, torch.Tensor] = {}
        self._quoted: dict[Pending, ByteTrie] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int) -> "VocabIndex":
        return cls(vocabulary_bytes(tokenizer, vocab_size))

    def plain(self, pending: Pending) -> tuple[torch.Tensor, torch.Tensor]:
        """(V,) bool: tokens that are pure string content when read after `pending`, and (V,) int64: the
        continuation bytes each leaves pending (a token may end inside a character)."""
        if pending not in self._plain:
            self._build(pending)
        return self._plain[pending], self._tail[pending]

    def quoted(self, pending: Pending) -> ByteTrie:
        """Trie of the suffixes, from the first quote or backslash on, of the tokens whose bytes before it are
        string content ending on a character boundary (read after `pending`); leaves hold the token ids."""
        if pending not in self._quoted:
            self._build(pending)
        return self._quoted[pending]

    def _build(self, pending: Pending) -> None:
        mask = torch.zeros(self.size, dtype=torch.bool)
        tail = torch.zeros(self.size, dtype=torch.long)
        quoted: list[tuple[bytes, int]] = []
        plain_ids, tails = [], []
        for i, data in enumerate(self.tokens):
            if not data:
                continue
            if pending is None and data.isascii() and _ascii_content(data):  # fast path: no UTF-8 to track
                plain_ids.append(i)
                tails.append(0)
                continue
            cut = _first_special(data)
            if cut < 0:
                end = string_run(pending, data)
                if end is not False:
                    plain_ids.append(i)
                    tails.append(0 if end is None else end[0])
            elif string_run(pending, data[:cut]) is None:
                quoted.append((data[cut:], i))
        ids = torch.tensor(plain_ids, dtype=torch.long)
        mask[ids] = True
        tail[ids] = torch.tensor(tails, dtype=torch.long)
        self._plain[pending], self._tail[pending], self._quoted[pending] = mask, tail, ByteTrie(quoted)


def _ascii_content(data: bytes) -> bool:
    """ASCII bytes that are all string content (no control byte, quote or backslash)."""
    return min(data) >= 0x20 and QUOTE not in data and BACKSLASH not in data


def _first_special(data: bytes) -> int:
    """Index of the first quote or backslash in data, or -1."""
    cuts = [j for j in (data.find(b'"'), data.find(b"\\")) if j >= 0]
    return min(cuts) if cuts else -1
