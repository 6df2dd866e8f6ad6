"""A byte-level pushdown automaton for JSON texts valid under a compiled schema (schema.py).

State = (stack, lex), immutable tuples (hashable, so masks can be cached per state):
    stack  the open containers, outermost first:  ("o", node, done, cur)  an object; done = bitmask of the
           properties written so far, cur = the one whose value is being written (-1: a free key)
                                                   ("a", node)            an array
    lex    what the next byte may be:
           ("val", node, ws)        a value of `node` (after up to WS_MAX whitespace bytes)
           ("key", first, ws)       a key, or "}" right after "{" (first=1) once the required keys are written
           ("colon", ws)            ":" after a key
           ("next", ws)             "," or the closing bracket after a member
           ("arr0", ws)             a first item or "]" right after "["
           ("str", node, esc, u8)   inside a string (node -1: a free key); esc 0 plain, 1 after "\\",
                                    2..5 inside "\\uXXXX" with esc-2 hex digits read; u8 the pending UTF-8
                                    continuation (n bytes left, the next in [lo, hi]) or None
           ("lit", node, which, cands, pos)   matching one of a set of literals ("k": the object's keys
                                    with their quotes, "v": the node's enum values); cands = the candidates
                                    still possible, pos = bytes matched
           ("num", node, part, count)         a number: part sign | zero | int | dot | frac | exp | esign | edig
           ("end",)                 the root value is complete; nothing may follow
step(state, byte) -> next state or None (the byte is not allowed). A number, or a literal that another
literal extends ("1" / "12"), ends only at the byte after it; that byte is then read by the state the
completed value leads to. Numbers are bounded (MAX_INT_DIGITS, MAX_FRAC_DIGITS, MAX_EXP_DIGITS) so every
output parses to a finite value, and nesting to MAX_DEPTH.

cost(state) = the fewest bytes that complete a valid text from `state` (whitespace never helps):
    value of node: min_len(node)   open object: its unwritten required members ("," key ":" value) + "}"
    open array: "]"   string: pending UTF-8 bytes + escape bytes left + the closing quote (+ ":" value for a
    key)   number: 1 after "-", ".", "e" or the exponent sign, else 0   literal: min over candidates of the
    bytes left (+ ":" value + closing of the object for a key)
Every state with cost c > 0 has a byte that leads to cost c - 1 (tested), so with one-byte tokens the
output can always be completed in c more tokens: the token masks use this to finish within max_tokens.
"""

from __future__ import annotations

from scratchlm.generate.constrained.schema import Grammar

WS = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
QUOTE, BACKSLASH, COLON, COMMA = ord('"'), ord("\\"), ord(":"), ord(",")
LBRACE, RBRACE, LBRACK, RBRACK, MINUS, ZERO, DOT = map(ord, "{}[]-0.")
WS_MAX = 16
MAX_DEPTH = 32
MAX_INT_DIGITS, MAX_FRAC_DIGITS, MAX_EXP_DIGITS = 16, 17, 2
NUMBER_DONE = {"zero", "int", "frac", "edig"}  # parts where the number may end
NUMBER_LEFT = {"sign": 1, "dot": 1, "exp": 1, "esign": 1}

State = tuple


def utf8_lead(b: int) -> tuple[int, int, int] | None:
    """The continuation a UTF-8 lead byte needs: (bytes left, lo, hi of the next); None if b is no lead."""
    if 0xC2 <= b <= 0xDF:
        return (1, 0x80, 0xBF)
    if 0xE0 <= b <= 0xEF:
        return (2, 0xA0 if b == 0xE0 else 0x80, 0x9F if b == 0xED else 0xBF)  # no overlongs, no surrogates
    if 0xF0 <= b <= 0xF4:
        return (3, 0x90 if b == 0xF0 else 0x80, 0x8F if b == 0xF4 else 0xBF)  # nothing above U+10FFFF
    return None


def utf8_next(pending: tuple[int, int, int] | None, b: int) -> tuple[int, int, int] | None | bool:
    """String-content byte b after `pending`: the new pending continuation, or False if b is not allowed."""
    if pending is not None:
        n, lo, hi = pending
        return (n - 1, 0x80, 0xBF) if n > 1 and lo <= b <= hi else (None if lo <= b <= hi else False)
    if b < 0x20 or b == QUOTE or b == BACKSLASH:
        return False
    if b < 0x80:
        return None
    lead = utf8_lead(b)
    return False if lead is None else lead


class JsonMachine:
    """step / accepting / complete / cost over the states described in the module docstring."""

    def __init__(self, grammar: Grammar) -> None:
        self.g = grammar
        self.nodes = grammar.nodes
        self._costs: dict[State, int] = {}

    def initial(self) -> State:
        return ((), ("val", self.g.root, 0))

    # ---- transitions ------------------------------------------------------------------------------------
    def step(self, state: State, b: int) -> State | None:
        stack, lex = state
        tag = lex[0]
        if tag == "str":
            return self._string(stack, lex, b)
        if tag == "end":
            return None
        if tag == "num":
            return self._number(stack, lex, b)
        if tag == "lit":
            return self._literal(stack, lex, b)
        if b in WS and tag != "lit":
            return (stack, lex[:-1] + (lex[-1] + 1,)) if lex[-1] < WS_MAX else None
        if tag == "val":
            return self._value(stack, lex[1], b)
        if tag == "key":
            return self._key(stack, lex[1], b)
        if tag == "colon":
            return (stack, ("val", self._member_node(stack[-1]), 0)) if b == COLON else None
        if tag == "next":
            return self._next(stack, b)
        return self._done(stack[:-1]) if b == RBRACK else self._value(stack, self.nodes[stack[-1][1]].items, b)

    def _done(self, stack: tuple) -> State:
        """A value just ended: the enclosing container or sequence goes on, or the text is complete."""
        if stack and stack[-1][0] == "s":
            return self._seq_enter(stack[:-1], stack[-1][1], stack[-1][2] + 1)
        return (stack, ("next", 0)) if stack else ((), ("end",))

    def _seq_enter(self, stack: tuple, node: int, p: int) -> State:
        """Part p of a seq node: match its literal, or push ("s", node, p) and read its value."""
        parts = self.nodes[node].parts
        if p == len(parts):
            return self._done(stack)
        if isinstance(parts[p], bytes):
            return (stack, ("lit", node, "s", (p,), 0))
        return (stack + (("s", node, p),), ("val", parts[p], 0))

    def _member_node(self, frame: tuple) -> int:
        n = self.nodes[frame[1]]
        return n.items if n.free else n.props[frame[3]][1]

    def _value(self, stack: tuple, node: int, b: int) -> State | None:
        n = self.nodes[node]
        kind = n.kind
        if kind == "union":
            for m in n.members:
                nxt = self._value(stack, m, b)
                if nxt is not None:
                    return nxt
            return None
        if kind == "seq":
            return self.step(self._seq_enter(stack, node, 0), b)
        if kind == "alt":
            return self.step((stack, ("lit", node, "a", tuple(range(len(n.members))), 0)), b)
        if kind == "object" and b == LBRACE and len(stack) < MAX_DEPTH:
            return (stack + (("o", node, 0, -1),), ("key", 1, 0))
        if kind == "array" and b == LBRACK and len(stack) < MAX_DEPTH:
            return (stack + (("a", node),), ("arr0", 0))
        if kind == "string" and b == QUOTE:
            return (stack, ("str", node, 0, None))
        if kind in ("number", "integer"):
            if b == MINUS:
                return (stack, ("num", node, "sign", 0))
            if b in DIGITS:
                return (stack, ("num", node, "zero", 1) if b == ZERO else ("num", node, "int", 1))
        if kind == "enum":
            cands = tuple(i for i, lit in enumerate(n.literals) if lit[0] == b)
            if cands:
                return self._matched(stack, node, "v", cands, 1)
        return None

    def _required_done(self, node: int, done: int) -> bool:
        req = self.nodes[node].required
        return done & req == req

    def _key(self, stack: tuple, first: int, b: int) -> State | None:
        _, node, done, _ = stack[-1]
        n = self.nodes[node]
        if b == RBRACE and first and (n.free or self._required_done(node, done)):
            return self._done(stack[:-1])
        if b != QUOTE:
            return None
        if n.free:
            return (stack, ("str", -1, 0, None))
        cands = tuple(i for i in range(len(n.props)) if not done >> i & 1)
        return self._matched(stack, node, "k", cands, 1) if cands else None

    def _next(self, stack: tuple, b: int) -> State | None:
        frame = stack[-1]
        n = self.nodes[frame[1]]
        if frame[0] == "a":
            if b == COMMA:
                return (stack, ("val", n.items, 0))
            return self._done(stack[:-1]) if b == RBRACK else None
        done = frame[2]
        if b == COMMA and (n.free or done != (1 << len(n.props)) - 1):
            return (stack, ("key", 0, 0))
        if b == RBRACE and (n.free or self._required_done(frame[1], done)):
            return self._done(stack[:-1])
        return None

    def _string(self, stack: tuple, lex: tuple, b: int) -> State | None:
        _, node, esc, u8 = lex
        if esc == 1:
            if b in ESCAPES:
                return (stack, ("str", node, 0, None))
            return (stack, ("str", node, 2, None)) if b == ord("u") else None
        if esc:
            return (stack, ("str", node, 0 if esc == 5 else esc + 1, None)) if b in HEX else None
        if u8 is None and b == QUOTE:
            return (stack, ("colon", 0)) if node == -1 else self._done(stack)
        if u8 is None and b == BACKSLASH:
            return (stack, ("str", node, 1, None))
        nxt = utf8_next(u8, b)
        if nxt is False:
            return None
        return (stack, lex) if nxt == u8 else (stack, ("str", node, 0, nxt))

    def _number(self, stack: tuple, lex: tuple, b: int) -> State | None:
        _, node, part, count = lex
        real = self.nodes[node].kind == "number"
        digit = b in DIGITS
        nxt = None
        if part in ("sign", "dot", "esign"):
            nxt = {"sign": ("zero", 1) if b == ZERO else ("int", 1), "dot": ("frac", 1), "esign": ("edig", 1)}[part]
            return (stack, ("num", node) + nxt) if digit else None
        if part == "exp":
            if b in b"+-":
                return (stack, ("num", node, "esign", 0))
            return (stack, ("num", node, "edig", 1)) if digit else None
        limit = {"zero": 0, "int": MAX_INT_DIGITS, "frac": MAX_FRAC_DIGITS, "edig": MAX_EXP_DIGITS}[part]
        if digit and count < limit:
            nxt = ("num", node, part, count + 1)
        elif real and b == DOT and part in ("zero", "int"):
            nxt = ("num", node, "dot", 0)
        elif real and b in b"eE" and part in ("zero", "int", "frac"):
            nxt = ("num", node, "exp", 0)
        if nxt is not None:
            return (stack, nxt)
        return self.step(self._done(stack), b)  # the number ended; b belongs to what follows

    def _literals(self, node: int, which: str) -> tuple:
        """"k": an object's keys (with quotes), "v": enum values, "a": each alt member's first literal,
        "s": a seq's parts (only its literal parts are ever candidates)."""
        n = self.nodes[node]
        if which == "k":
            return tuple(k for k, _ in n.props)
        if which == "a":
            return tuple(self.nodes[m].parts[0] for m in n.members)
        return n.parts if which == "s" else n.literals

    def _matched(self, stack: tuple, node: int, which: str, cands: tuple, pos: int) -> State:
        """After pos bytes of the candidates: complete now if every candidate left is fully matched."""
        lits = self._literals(node, which)
        if all(len(lits[i]) == pos for i in cands):
            return self._literal_done(stack, node, which, cands[0])
        return (stack, ("lit", node, which, cands, pos))

    def _literal_done(self, stack: tuple, node: int, which: str, i: int) -> State:
        if which == "v":
            return self._done(stack)
        if which in ("a", "s"):
            seq, nxt = (self.nodes[node].members[i], 1) if which == "a" else (node, i + 1)
            return self._seq_enter(stack, seq, nxt)
        _, _, done, _ = stack[-1]
        return (stack[:-1] + (("o", node, done | 1 << i, i),), ("colon", 0))

    def _literal(self, stack: tuple, lex: tuple, b: int) -> State | None:
        _, node, which, cands, pos = lex
        lits = self._literals(node, which)
        nxt = tuple(i for i in cands if len(lits[i]) > pos and lits[i][pos] == b)
        if nxt:
            return self._matched(stack, node, which, nxt, pos + 1)
        full = [i for i in cands if len(lits[i]) == pos]
        return self.step(self._literal_done(stack, node, which, full[0]), b) if full else None

    # ---- end conditions and cost --------------------------------------------------------------------------
    def complete(self, state: State) -> bool:
        """Nothing may follow: generation must end here."""
        return state[1][0] == "end"

    def accepting(self, state: State) -> bool:
        """The bytes so far are a complete valid text (a root number may still grow)."""
        stack, lex = state
        if lex[0] == "end":
            return True
        if stack:
            return False
        if lex[0] == "num":
            return lex[2] in NUMBER_DONE
        if lex[0] == "lit":
            lits = self._literals(lex[1], lex[2])
            return any(len(lits[i]) == lex[4] for i in lex[3])
        return False

    def forget(self) -> None:
        """Drop the memoised costs (they are recomputed on demand)."""
        self._costs = {}

    def cost(self, state: State) -> int:
        hit = self._costs.get(state)
        if hit is None:
            hit = self._costs[state] = self._cost(*state)
        return hit

    def _close(self, stack: tuple) -> int:
        """Bytes that close every open container once their current members are complete."""
        total = 0
        for frame in stack:
            if frame[0] == "s":
                total += self._seq_rest(frame[1], frame[2] + 1)
            elif frame[0] == "a" or self.nodes[frame[1]].free:
                total += 1
            else:
                total += self._object_rest(frame[1], frame[2]) + 1
        return total

    def _seq_rest(self, node: int, p: int) -> int:
        """Fewest bytes of a seq's parts p.."""
        return sum(len(x) if isinstance(x, bytes) else self.g.min_len[x] for x in self.nodes[node].parts[p:])

    def _prop_cost(self, node: int, i: int) -> int:
        key, value = self.nodes[node].props[i]
        return len(key) + 1 + self.g.min_len[value]

    def _object_rest(self, node: int, done: int) -> int:
        """"," key ":" value for every required property not written yet."""
        n = self.nodes[node]
        return sum(1 + self._prop_cost(node, i) for i in range(len(n.props)) if n.required >> i & 1 and not done >> i & 1)

    def _cost(self, stack: tuple, lex: tuple) -> int:
        tag = lex[0]
        if tag == "end":
            return 0
        if tag == "val":
            return self.g.min_len[lex[1]] + self._close(stack)
        if tag in ("next",):
            return self._close(stack)
        if tag == "colon":
            return 1 + self.g.min_len[self._member_node(stack[-1])] + self._close(stack)
        if tag == "arr0":
            return 1 + self._close(stack[:-1])
        if tag == "num":
            return NUMBER_LEFT.get(lex[2], 0) + self._close(stack)
        if tag == "str":
            _, node, esc, u8 = lex
            left = (u8[0] if u8 else 0) + (1 if esc == 1 else 6 - esc if esc else 0) + 1
            if node == -1:
                return left + 1 + self.g.min_len[self._member_node(stack[-1])] + self._close(stack)
            return left + self._close(stack)
        if tag == "key":
            return self._key_cost(stack, lex[1])
        return self._literal_cost(stack, lex)

    def _key_cost(self, stack: tuple, first: int) -> int:
        _, node, done, _ = stack[-1]
        n = self.nodes[node]
        rest = self._close(stack[:-1])
        if n.free:
            return rest + (1 if first else 2 + 1 + self.g.min_len[n.items] + 1)
        missing = self._object_rest(node, done)
        if missing:
            return rest + missing - 1 + 1  # the first of them needs no ","
        if first:
            return rest + 1
        return rest + min(self._prop_cost(node, i) for i in range(len(n.props)) if not done >> i & 1) + 1

    def _literal_cost(self, stack: tuple, lex: tuple) -> int:
        _, node, which, cands, pos = lex
        lits = self._literals(node, which)
        if which == "v":
            return min(len(lits[i]) - pos for i in cands) + self._close(stack)
        if which == "a":
            members = self.nodes[node].members
            return min(len(lits[i]) - pos + self._seq_rest(members[i], 1) for i in cands) + self._close(stack)
        if which == "s":
            return len(lits[cands[0]]) - pos + self._seq_rest(node, cands[0] + 1) + self._close(stack)
        _, _, done, _ = stack[-1]
        rest = self._close(stack[:-1])
        return rest + min(len(lits[i]) - pos + 1 + self.g.min_len[self.nodes[node].props[i][1]]
                          + self._object_rest(node, done | 1 << i) + 1 for i in cands)
