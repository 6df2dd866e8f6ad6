"""Random JSON schemas of the supported subset, and random valid instances of them (seeded), for the
constrained-decoding tests. Names and strings mix scripts, quotes, backslashes and control characters."""

from __future__ import annotations

import random
from typing import Any

NAMES = ["name", "age", "a\"b", "ключ", "x\\y", "emoji😀", "tab\tkey", "n", "nn", "id", "价格", "value"]
PRIMITIVES = ["string", "integer", "number", "boolean", "null"]


def random_text(rng: random.Random, n: int) -> str:
    pool = "abc xyz\"\\\n\t/éß中文😀\u0001" + "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(8))
    return "".join(rng.choice(pool) for _ in range(n))


def random_scalar(rng: random.Random) -> Any:
    return rng.choice([rng.randint(-50, 500), round(rng.uniform(-100, 100), 3), random_text(rng, 3), True, False,
                       None, rng.choice(["1", "12", 1, 12, 1.5])])


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    kinds = PRIMITIVES + ["enum", "const", "union"] + (["array", "object", "any"] if depth < 3 else [])
    kind = rng.choice(kinds + (["object"] * 2 if depth == 0 else []))
    if kind in PRIMITIVES:
        return {"type": kind, "description": "annotations are ignored"} if rng.random() < 0.2 else {"type": kind}
    if kind == "enum":
        return {"enum": list(dict.fromkeys(random_scalar(rng) for _ in range(rng.randint(1, 4))))}
    if kind == "const":
        return {"const": random_scalar(rng)}
    if kind == "union":
        return {"type": rng.sample(PRIMITIVES + ["array"], rng.randint(2, 3))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1)} if rng.random() < 0.9 else {"type": "array"}
    if kind == "any":
        return {}
    names = rng.sample(NAMES, rng.randint(0, 4))
    schema: dict[str, Any] = {"type": "object", "properties": {k: random_schema(rng, depth + 1) for k in names},
                              "required": [k for k in names if rng.random() < 0.6]}
    if rng.random() < 0.5:
        schema["additionalProperties"] = False
    return schema


def random_instance(rng: random.Random, schema: dict[str, Any], depth: int = 0) -> Any:
    """A value valid under `schema` (of the subset random_schema writes)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    t = schema.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t is None:
        t = rng.choice(PRIMITIVES if depth > 2 else PRIMITIVES + ["array", "object"])
        schema = {}
    if t == "object":
        if "properties" not in schema:  # a free object: any keys
            return {random_text(rng, 2): random_instance(rng, {}, depth + 1) for _ in range(rng.randint(0, 2))}
        props = schema["properties"]
        keys = [k for k in props if k in schema.get("required", []) or rng.random() < 0.5]
        rng.shuffle(keys)
        return {k: random_instance(rng, props[k], depth + 1) for k in keys}
    if t == "array":
        return [random_instance(rng, schema.get("items", {}), depth + 1) for _ in range(rng.randint(0, 3))]
    return {"string": lambda: random_text(rng, rng.randint(0, 6)), "integer": lambda: rng.randint(-10**6, 10**6),
            "number": lambda: round(rng.uniform(-1e4, 1e4), 4), "boolean": lambda: rng.random() < 0.5,
            "null": lambda: None}[t]()
