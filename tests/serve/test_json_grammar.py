"""The JSON automaton and its token masks (generate/constrained), against trusted references: Python's json
module and the jsonschema validator for every text, and a brute-force walk of every token for the masks.

    - valid instances (json.dumps, compact and indented) are accepted byte by byte and end accepting
    - random byte walks (any allowed byte, within a byte budget) always end as JSON that parses and validates
    - cost(state) is exact: closing greedily from any state takes exactly cost(state) bytes
    - GrammarMasks.allowed equals the brute force (walk every token's bytes; cost <= budget) on the states
      of random token walks, including tight budgets; the cached masks equal a fresh uncached computation
    - sampled decoding over a vocabulary with multi-byte and partial-UTF-8 tokens always parses and validates
    - schemas outside the subset are refused, naming the keyword and where it is
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from scratchlm.generate.constrained import (GrammarMasks, JsonMachine, SchemaError, TokenConstraint, VocabIndex,
                                            any_object, compile_schema)

from json_schemas import random_instance, random_schema, random_text

N_SCHEMAS = 60
STOP = 0  # token 0 plays the end-of-text token in the synthetic vocabulary


def schemas(seed: int, n: int = N_SCHEMAS):
    rng = random.Random(seed)
    return [(rng, random_schema(rng)) for _ in range(n)]


def feed(machine: JsonMachine, data: bytes):
    state = machine.initial()
    for b in data:
        state = machine.step(state, b)
        if state is None:
            return None
    return state


def test_valid_instances_are_accepted():
    for rng, schema in schemas(1):
        machine = JsonMachine(compile_schema(schema))
        for _ in range(4):
            value = random_instance(rng, schema)
            jsonschema.validate(value, schema)  # the generator itself is right
            for text in (json.dumps(value, ensure_ascii=False), json.dumps(value, indent=2, ensure_ascii=False)):
                state = feed(machine, text.encode())
                assert state is not None and machine.accepting(state), (schema, text)


def random_walk(machine: JsonMachine, rng: random.Random, budget: int) -> tuple[bytes, list]:
    """Allowed random bytes (the completion always within budget) until the text is complete."""
    state, out, states = machine.initial(), bytearray(), []
    assert machine.cost(state) <= budget
    while not machine.complete(state):
        if machine.accepting(state) and rng.random() < 0.3:
            break
        states.append(state)
        left = budget - len(out) - 1
        options = [(b, s) for b in range(256) if (s := machine.step(state, b)) is not None and machine.cost(s) <= left]
        if not options and machine.accepting(state):  # a root number at the end of the budget
            break
        assert options, (state, bytes(out))
        b, state = rng.choice(options)
        out.append(b)
    assert machine.accepting(state)
    return bytes(out), states


def test_random_walks_always_parse_and_validate():
    for rng, schema in schemas(2):
        machine = JsonMachine(compile_schema(schema))
        for _ in range(3):
            budget = machine.cost(machine.initial()) + rng.randint(0, 60)
            data, _ = random_walk(machine, rng, budget)
            assert len(data) <= budget
            jsonschema.validate(json.loads(data.decode("utf-8")), schema)


def test_cost_is_the_exact_bytes_to_complete():
    for rng, schema in schemas(3, 25):
        machine = JsonMachine(compile_schema(schema))
        _, states = random_walk(machine, rng, machine.cost(machine.initial()) + 40)
        for state in rng.sample(states, min(6, len(states))):
            need, steps = machine.cost(state), 0
            while not machine.accepting(state):
                options = [s for b in range(256) if (s := machine.step(state, b)) is not None]
                state = min(options, key=machine.cost)
                steps += 1
            assert steps == need


def synthetic_vocab(seed: int = 0) -> list[bytes | None]:
    """256 single bytes, JSON-ish pieces, and byte slices of mixed-script text cut anywhere (partial UTF-8)."""
    rng = random.Random(seed)
    text = ("{\"name\": \"ключ 中文 😀 é\", \"a\\\"b\": [1, 12, -0.5e3, true, null], \"x\\\\y\": {}}\n" * 3).encode()
    pieces = {text[i : i + rng.randint(2, 6)] for i in (rng.randrange(len(text)) for _ in range(400))}
    pieces |= {b'{"', b'":', b'",', b' "', b'},', b"[1", b"true", b"null,", b"\\n", b"\\u00", b'"}', b'"]}'}
    tokens: list[bytes | None] = [None] + [bytes([b]) for b in range(256)] + sorted(pieces)
    return tokens


def brute_force(masks: GrammarMasks, state, budget: int) -> torch.Tensor:
    out = torch.zeros(masks.index.size, dtype=torch.bool)
    for i, data in enumerate(masks.index.tokens):
        end = None if data is None else masks.walk(state, data)
        out[i] = end is not None and masks.machine.cost(end) <= budget
    if masks.machine.accepting(state):
        out[STOP] = True
    return out


def test_masks_equal_the_brute_force():
    index = VocabIndex(synthetic_vocab())
    rng = random.Random(4)
    for _, schema in schemas(5, 25):
        masks = GrammarMasks(compile_schema(schema), index, [STOP])
        constraint, budget = TokenConstraint(masks), masks.min_tokens() + rng.randint(0, 20)
        for step in range(min(40, budget)):
            left = budget - step - 1
            for b in (left, rng.randint(0, left), 10**6):
                if b >= masks.machine.cost(constraint.state) - 1:
                    assert torch.equal(masks.allowed(constraint.state, b), brute_force(masks, constraint.state, b))
            allowed = masks.allowed(constraint.state, left).nonzero()[:, 0].tolist()
            token = rng.choice(allowed)
            if token == STOP or constraint.complete:
                break
            constraint.advance(token)
            if constraint.complete:
                break


def test_byte_trie_walk_finds_every_key_and_prefix():
    """The implicit sorted-list trie: a full walk reaches exactly the prefixes of the keys, and reports each id
    at its key's end (duplicate keys, byte 255 and one-byte keys included)."""
    from scratchlm.generate.constrained.byte_trie import ByteTrie

    rng = random.Random(13)
    keys = [bytes(rng.choice([0, 1, 34, 92, 254, 255]) for _ in range(rng.randint(1, 5))) for _ in range(300)]
    keys += [b"\xff", b"\xff\xff", keys[0]]  # a duplicate key under another id
    trie = ByteTrie([(k, i) for i, k in enumerate(keys)])
    ends: dict[bytes, list[int]] = {}
    prefixes = set()
    todo = [(trie.root, b"")]
    while todo:
        node, prefix = todo.pop()
        for c, child, ending, deeper in trie.children(node):
            path = prefix + bytes([c])
            prefixes.add(path)
            if ending:
                ends[path] = sorted(ending)
            if deeper:
                todo.append((child, path))
    assert prefixes == {k[:j] for k in keys for j in range(1, len(k) + 1)}
    assert ends == {k: sorted(i for i, x in enumerate(keys) if x == k) for k in keys}


def test_cached_masks_equal_uncached_ones():
    """The mask cache (per state and clipped budget, LRU in bytes, sparse or dense entries) returns what a fresh
    GrammarMasks computes from nothing, on the states of random token walks over random schemas, with budgets
    from tight to unbounded; revisited states are hits, a small cache evicts, and no caller's use of a returned
    mask changes what later callers get."""
    index = VocabIndex(synthetic_vocab(2))
    rng = random.Random(11)
    hits = evicted = 0
    for _, schema in schemas(12, 30):
        grammar = compile_schema(schema)
        masks = GrammarMasks(grammar, index, [STOP], cache_bytes=rng.choice([4 * index.size, 1 << 20]))
        seen: list[tuple] = []
        for _ in range(3):  # three walks: the later ones revisit the first one's states
            constraint, budget = TokenConstraint(masks), masks.min_tokens() + rng.randint(0, 25)
            for step in range(budget):
                left = budget - step - 1
                for b in {left, rng.randint(0, left)}:
                    got = masks.allowed(constraint.state, b)
                    seen.append((constraint.state, b, got.clone()))
                    logits = torch.zeros(index.size).masked_fill_(~got, float("-inf"))  # a caller's use of it
                allowed = masks.allowed(constraint.state, left).nonzero()[:, 0].tolist()
                token = rng.choice(allowed)
                if token == STOP:
                    break
                constraint.advance(token)
                if constraint.complete:
                    break
        fresh = GrammarMasks(grammar, index, [STOP], cache_bytes=0)  # nothing cached: every mask computed anew
        for state, b, first in seen:
            assert torch.equal(fresh.compute(state, b), first), (schema, state, b)
            assert torch.equal(masks.allowed(state, b), first), (schema, state, b)  # the cache, evicted or hit
        hits += masks.hits
        evicted += masks.misses > len(masks._masks)
    assert hits > 1000 and evicted > 5


def test_sampled_decoding_always_parses_and_validates():
    index = VocabIndex(synthetic_vocab(1))
    gen = torch.Generator().manual_seed(6)
    cases = [(s, compile_schema(s)) for _, s in schemas(7)] + [({"type": "object"}, any_object())]
    for schema, grammar in cases:
        masks = GrammarMasks(grammar, index, [STOP])
        for _ in range(3):
            constraint = TokenConstraint(masks)
            budget = masks.min_tokens() + int(torch.randint(0, 30, (1,), generator=gen))
            out = []
            for step in range(budget):
                logits = torch.randn(index.size, generator=gen) * 4
                logits[~constraint.allowed(budget - step - 1)] = float("-inf")
                token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
                if token == STOP:
                    break
                constraint.advance(token)
                out.append(token)
                if constraint.complete:
                    break
            assert constraint.accepting
            jsonschema.validate(json.loads(b"".join(index.tokens[t] for t in out).decode("utf-8")), schema)


@pytest.mark.parametrize("schema,named", [
    ({"type": "string", "pattern": "^a"}, "'pattern' are outside"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}, "#/properties/a"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "['b'] are not in properties"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties"),
    ({"anyOf": [{"type": "string"}]}, "'anyOf'"),
    ({"$ref": "#/$defs/x", "$defs": {}}, "'$defs', '$ref'"),
    ({"type": "date"}, "'date' is not one of"),
    ({"type": "array", "items": [{"type": "string"}]}, "tuple validation"),
    ({"enum": []}, "non-empty"),
    ({"type": "string", "enum": [1]}, "is not of type"),
    ({"type": ["string", "string"]}, "no repeats"),
])
def test_schemas_outside_the_subset_are_refused(schema, named):
    with pytest.raises(SchemaError, match=None) as exc:
        compile_schema(schema)
    assert named in str(exc.value)


def test_min_tokens_is_the_shortest_valid_text():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"enum": [10, 2]},
                                               "opt": {"type": "array"}}, "required": ["name", "n"]}
    shortest = '{"name":"","n":2}'
    jsonschema.validate(json.loads(shortest), schema)
    machine = JsonMachine(compile_schema(schema))
    assert machine.cost(machine.initial()) == len(shortest)


def test_free_strings_take_escapes_and_any_utf8():
    """Keys and enum values are matched in json.dumps' own form; free strings take every valid spelling."""
    machine = JsonMachine(any_object())
    rng = random.Random(8)
    for _ in range(50):
        value = {random_text(rng, 3): [random_text(rng, 5), round(rng.random(), 9), None]}
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False), '{"\\ud83d\\ude00": "\\/"}'):
            state = feed(machine, text.encode())
            assert state is not None and machine.complete(state)
    for bad in (b'{"a":1,}', b'{"a" 1}', b"[1]", b'{"a":01}', b'{"\x01":1}', b'{"\xc3\x28":1}', b'{"\xed\xa0\x80":1}',
                b'{"a":1e999}', b'{"a":"\\q"}', b'{"a":' + b"1" * 17 + b"}"):
        assert feed(machine, bad) is None or not machine.accepting(feed(machine, bad)), bad
