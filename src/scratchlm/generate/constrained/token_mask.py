"""Token masks from the JSON automaton: which token ids may come next, so that the text stays valid and
can still be completed within the tokens left.

For a state s, a token t of bytes b_1..b_m is allowed iff the automaton accepts b_1..b_m from s and the
state it reaches, s', can be completed in the tokens left after t:  cost(s') <= budget  (cost in bytes =
an upper bound on tokens when one-byte tokens exist). Stop tokens (end of text / turn) are allowed only
where the text so far is complete.

Per state a MaskSpec is computed once (cached; states repeat: the same object key, a string's content...):
the tokens a pruned trie walk reaches, with the cost(s') of the state each leads to; for string content the
precomputed plain[u] set (vocab_index.py) with one conservative cost, and the walk covers only the suffix
trie of the tokens holding a quote or backslash. The masks themselves are cached per key
    (state, min(budget, spec.max_cost))        every budget >= max_cost gives the same mask
in one LRU bounded in bytes (cache_bytes): dense (V,) bool, or the allowed ids when they are few (the
structural states: after "{", inside a number, ...). So after its first visit a state costs a dict lookup
per decode step, whatever the vocabulary size, and, for the chosen token, m memoised transitions.
`compute` is the same mask without the mask cache (tests hold the two equal).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from scratchlm.generate.constrained.json_machine import WS_MAX, JsonMachine, State
from scratchlm.generate.constrained.schema import Grammar
from scratchlm.generate.constrained.byte_trie import ByteTrie
from scratchlm.generate.constrained.vocab_index import VocabIndex

MAX_SPECS = 4096  # cached states per grammar before the spec and transition caches are cleared
MAX_STATES = 200_000  # memoised transitions' states, likewise
MASK_CACHE_BYTES = 16 << 20  # cached masks per grammar, in bytes (dense: V bytes each; sparse: 8 per allowed id)
WS_GAPS = ("val", "key", "colon", "next", "arr0")  # lex states whose last field counts whitespace


@dataclass
class MaskSpec:
    ids: torch.Tensor  # (k,) int64 tokens found by walking
    costs: torch.Tensor  # (k,) int64 their cost(s')
    plain: bool  # the string-content set plain[pending] applies too
    pending: tuple | None
    plain_cost: int  # cost after a plain token that ends on a character boundary (+1 per pending byte)
    accepting: bool
    max_cost: int = 0


class GrammarMasks:
    """Masks of one grammar over one vocabulary; shared by every sequence that uses the grammar."""

    def __init__(self, grammar: Grammar, index: VocabIndex, stop_ids: list[int],
                 cache_bytes: int = MASK_CACHE_BYTES) -> None:
        self.machine = JsonMachine(grammar)
        self.index = index
        self.stop_ids = [i for i in stop_ids if i < index.size]
        self.cache_bytes = cache_bytes
        self._trans: dict[State, dict[int, State | None]] = {}
        self._specs: dict[State, MaskSpec] = {}
        self._masks: OrderedDict[tuple[State, int], torch.Tensor] = OrderedDict()  # dense bool or int64 ids
        self._mask_bytes = 0
        self.hits = self.misses = 0  # mask cache lookups (tests and benchmarks read them)

    def min_tokens(self) -> int:
        """Tokens the shortest valid text needs at most (its length in bytes)."""
        return self.machine.cost(self.machine.initial())

    def step(self, state: State, b: int) -> State | None:
        row = self._trans.get(state)
        if row is None:
            row = self._trans[state] = {}
        if b not in row:
            row[b] = self.machine.step(state, b)
        return row[b]

    def walk(self, state: State, data: bytes) -> State | None:
        for b in data:
            state = self.step(state, b)
            if state is None:
                return None
        return state

    def spec(self, state: State) -> MaskSpec:
        hit = self._specs.get(state)
        if hit is not None:
            return hit
        if len(self._specs) >= MAX_SPECS or len(self._trans) >= MAX_STATES:  # bounded memory: start over
            self._specs.clear()
            self._trans.clear()
            self.machine.forget()
        stack, lex = state
        if lex[0] == "str" and lex[2] == 0:  # string content: plain set + the quote/backslash suffixes
            boundary = (stack, lex[:3] + (None,))  # where a token's content prefix leaves the state
            ids, costs = self._walk_trie(boundary, self.index.quoted(lex[3]))
            base = self.machine.cost(boundary)
            plain, tail = self.index.plain(lex[3])
            top = int(tail[plain].max()) if plain.any() else 0
            hit = MaskSpec(ids, costs, True, lex[3], base, self.machine.accepting(state))
            hit.max_cost = max([base + top] + costs.tolist())
        else:
            ids, costs = self._walk_trie(state, self.index.trie)
            hit = MaskSpec(ids, costs, False, None, 0, self.machine.accepting(state), max(costs.tolist(), default=0))
        self._specs[state] = hit
        return hit

    def _walk_trie(self, state: State, trie: ByteTrie) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth-first over a trie from `state`, pruning every subtree whose first byte the automaton refuses."""
        ids, costs = [], []
        todo = [(trie.root, state)]
        while todo:
            node, st = todo.pop()
            for b, child, ending, deeper in trie.children(node):
                nxt = self.step(st, b)
                if nxt is None:
                    continue
                if ending:
                    ids += ending
                    costs += [self.machine.cost(nxt)] * len(ending)
                if deeper:
                    todo.append((child, nxt))
        return torch.tensor(ids, dtype=torch.long), torch.tensor(costs, dtype=torch.long)

    def _gap_base(self, state: State) -> State:
        """k whitespace bytes into a gap: the same state at k = 0 (whose mask it filters)."""
        stack, lex = state
        return (stack, lex[:-1] + (0,)) if lex[0] in WS_GAPS and lex[-1] else state

    def allowed(self, state: State, budget: int) -> torch.Tensor:
        """(V,) bool: the tokens allowed after `state` with `budget` tokens left after this one. Cached: the
        tensor may be shared with other callers, so read it, never write to it."""
        key = (state, min(budget, self.spec(self._gap_base(state)).max_cost))
        hit = self._masks.get(key)
        if hit is not None:
            self._masks.move_to_end(key)
            self.hits += 1
            return hit if hit.dtype == torch.bool else self._dense(hit)
        self.misses += 1
        mask = self.compute(state, budget)
        self._store(key, mask)
        return mask

    def compute(self, state: State, budget: int) -> torch.Tensor:
        """The mask of allowed(state, budget) computed from the state's spec, without the mask cache."""
        stack, lex = state
        if lex[0] in WS_GAPS and lex[-1]:  # the k = 0 mask, minus the tokens whose whitespace would pass WS_MAX
            return self.compute(self._gap_base(state), budget) & (self.index.lead_ws <= WS_MAX - lex[-1])
        spec = self.spec(state)
        return self._build(spec, None if budget >= spec.max_cost else budget)

    def _dense(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(self.index.size, dtype=torch.bool)
        mask[ids] = True
        return mask

    def _store(self, key: tuple[State, int], mask: torch.Tensor) -> None:
        """Keep a mask: as its ids when they take at most a quarter of the dense bytes; evict LRU past cache_bytes."""
        ids = mask.nonzero()[:, 0]
        entry = ids if ids.numel() * 8 * 4 <= mask.numel() else mask
        size = entry.numel() * entry.element_size()
        if size > self.cache_bytes:
            return
        self._masks[key] = entry
        self._mask_bytes += size
        while self._mask_bytes > self.cache_bytes:
            _, old = self._masks.popitem(last=False)
            self._mask_bytes -= old.numel() * old.element_size()

    def _build(self, spec: MaskSpec, budget: int | None) -> torch.Tensor:
        if spec.plain:
            plain, tail = self.index.plain(spec.pending)
            mask = plain.clone() if budget is None else plain & (tail <= budget - spec.plain_cost)
        else:
            mask = torch.zeros(self.index.size, dtype=torch.bool)
        mask[spec.ids if budget is None else spec.ids[spec.costs <= budget]] = True
        if spec.accepting:
            mask[self.stop_ids] = True
        if not mask.any() and spec.ids.numel():  # budget below every cost: the closest to done
            mask[spec.ids[spec.costs == spec.costs.min()]] = True
        return mask


class TokenConstraint:
    """One sequence's position in the grammar: allowed(budget) before each token, advance(token) after."""

    def __init__(self, masks: GrammarMasks) -> None:
        self.masks = masks
        self.state = masks.machine.initial()

    def allowed(self, budget: int) -> torch.Tensor:
        return self.masks.allowed(self.state, budget)

    def advance(self, token: int) -> None:
        data = self.masks.index.tokens[token] if token < self.masks.index.size else None
        nxt = None if data is None else self.masks.walk(self.state, data)
        if nxt is None:
            raise ValueError(f"token {token} ({data!r}) is not allowed by the grammar here")
        self.state = nxt

    @property
    def complete(self) -> bool:
        return self.masks.machine.complete(self.state)

    @property
    def accepting(self) -> bool:
        return self.masks.machine.accepting(self.state)
