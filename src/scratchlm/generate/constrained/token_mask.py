"""Token masks from the JSON automaton: which token ids may come next, so that the text stays valid and
can still be completed within the tokens left.

For a state s, a token t of bytes b_1..b_m is allowed iff the automaton accepts b_1..b_m from s and the
state it reaches, s', can be completed in the tokens left after t:  cost(s') <= budget  (cost in bytes =
an upper bound on tokens when one-byte tokens exist). Stop tokens (end of text / turn) are allowed only
where the text so far is complete.

Per state a MaskSpec is computed once and cached (states repeat: the same object key, a string's
content...): the walked tokens with their cost(s'), and for string content the precomputed plain[u]
set (vocab_index.py) with one conservative cost. A mask for a budget >= every cost is cached as a
(V,) bool tensor (LRU); a tighter budget filters the spec. Per decode step the work is then a dict
lookup and, for the chosen token, m transitions (themselves memoised per state).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from scratchlm.generate.constrained.json_machine import WS_MAX, JsonMachine, State
from scratchlm.generate.constrained.schema import Grammar
from scratchlm.generate.constrained.vocab_index import VocabIndex

MAX_SPECS = 4096  # cached states per grammar before the caches are cleared
MAX_STATES = 200_000  # memoised transitions' states, likewise
MAX_FULL = 256  # cached full masks per grammar
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

    def __init__(self, grammar: Grammar, index: VocabIndex, stop_ids: list[int]) -> None:
        self.machine = JsonMachine(grammar)
        self.index = index
        self.stop_ids = [i for i in stop_ids if i < index.size]
        self._trans: dict[State, dict[int, State | None]] = {}
        self._specs: dict[State, MaskSpec] = {}
        self._full: OrderedDict[State, torch.Tensor] = OrderedDict()

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
            self._full.clear()
            self.machine.forget()
        stack, lex = state
        if lex[0] == "str" and lex[2] == 0:  # string content: plain set + the tokens that reach a quote
            ids, costs = self._walk_tokens(state, self.index.quoted(lex[3]))
            base = self.machine.cost((stack, lex[:3] + (None,)))
            plain, tail = self.index.plain(lex[3])
            top = int(tail[plain].max()) if plain.any() else 0
            hit = MaskSpec(ids, costs, True, lex[3], base, self.machine.accepting(state))
            hit.max_cost = max([base + top] + costs.tolist())
        else:
            ids, costs = self._walk_trie(state)
            hit = MaskSpec(ids, costs, False, None, 0, self.machine.accepting(state), max(costs.tolist(), default=0))
        self._specs[state] = hit
        return hit

    def _walk_tokens(self, state: State, candidates: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, costs = [], []
        for i in candidates:
            end = self.walk(state, self.index.tokens[i])
            if end is not None:
                ids.append(i)
                costs.append(self.machine.cost(end))
        return torch.tensor(ids, dtype=torch.long), torch.tensor(costs, dtype=torch.long)

    def _walk_trie(self, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth-first over the trie, pruning every subtree whose first byte the automaton refuses."""
        ids, costs = [], []
        todo = [(self.index.root, state)]
        while todo:
            (children, _), st = todo.pop()
            for b, child in children.items():
                nxt = self.step(st, b)
                if nxt is None:
                    continue
                if child[1]:
                    c = self.machine.cost(nxt)
                    ids += child[1]
                    costs += [c] * len(child[1])
                if child[0]:
                    todo.append((child, nxt))
        return torch.tensor(ids, dtype=torch.long), torch.tensor(costs, dtype=torch.long)

    def allowed(self, state: State, budget: int) -> torch.Tensor:
        """(V,) bool: the tokens allowed after `state` with `budget` tokens left after this one."""
        stack, lex = state
        if lex[0] in WS_GAPS and lex[-1]:  # k whitespace bytes into a gap: the k = 0 mask, minus long runs
            return self.allowed((stack, lex[:-1] + (0,)), budget) & (self.index.lead_ws <= WS_MAX - lex[-1])
        spec = self.spec(state)
        if budget >= spec.max_cost:
            full = self._full.get(state)
            if full is None:
                full = self._full[state] = self._build(spec, None)
                if len(self._full) > MAX_FULL:
                    self._full.popitem(last=False)
            else:
                self._full.move_to_end(state)
            return full
        return self._build(spec, budget)

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
