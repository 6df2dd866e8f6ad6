"""A JSON Schema subset compiled into grammar nodes for the JSON machine (json_machine.py).

Supported (everything else is a SchemaError naming the keyword and where it is):
    type            "object" | "array" | "string" | "number" | "integer" | "boolean" | "null", or a list of
                    them (a union: ["string", "null"] is how a nullable field is written)
    properties, required, additionalProperties (false, or true / absent: still only the listed
                    properties are generated, which is valid either way)
    items           (absent: any JSON value)
    enum, const     any JSON values, matched literally as json.dumps writes them
    annotations     title, description, default, examples, $schema, $id, $comment (ignored)
A schema with no type, enum or const: "object" if it has properties, "array" if it has items, else any
JSON value (`{}`). Generated objects write each property at most once, in any order; "}" is allowed
only once every required property is written.

Nodes are plain data, referenced by index (an "any" value refers to itself through its array and
object members). min_len[i] = the length in bytes of the shortest JSON text valid for node i:
    string 2 ("")   number 1 (0)   enum min len(literal)   array 2 ([])   free object 2 ({})
    object 2 + sum_{required p} (len(key_p) + 1 + min_len(p)) + (#required - 1)   union min over members
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment"}
KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "enum", "const"} | ANNOTATIONS
SUBSET = ("type (object/array/string/number/integer/boolean/null or a list of them), properties, required, "
          "additionalProperties false/true, items, enum, const")


class SchemaError(ValueError):
    """A schema outside the supported subset (or not a valid schema)."""


@dataclass(frozen=True)
class Node:
    """One grammar node. kind: object | array | string | number | integer | enum | union, or (built in code,
    not from a schema) seq: fixed literal bytes and values in order | alt: seqs told apart by their first
    literal (e.g. a tool call: '{"name": "f", "arguments": ' ARGS '}' for each tool f)."""

    kind: str
    props: tuple[tuple[bytes, int], ...] = ()  # object: (JSON-encoded key with its quotes, value node)
    required: int = 0  # object: bit i set = props[i] is required
    free: bool = False  # object: any keys (free strings), every value node `items`
    items: int = -1  # array: the item node; free object: the value node
    literals: tuple[bytes, ...] = ()  # enum: JSON-encoded values
    members: tuple[int, ...] = ()  # union: member nodes (their first bytes never overlap); alt: seq nodes
    parts: tuple[bytes | int, ...] = ()  # seq: literal bytes or value nodes, in order


@dataclass
class Grammar:
    nodes: list[Node] = field(default_factory=list)
    root: int = 0
    min_len: list[int] = field(default_factory=list)

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1


def literal(value: Any, where: str) -> bytes:
    """The JSON text of a value, as the grammar matches it (compact separators, UTF-8)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: {value!r} cannot be written as JSON ({exc})") from None


def _add_any(g: Grammar) -> int:
    """Any JSON value: a union of a free object, an array of any, string, number and true/false/null."""
    any_id = g.add(Node("union"))  # members filled in below (they refer back to it)
    members = (g.add(Node("object", free=True, items=any_id)), g.add(Node("array", items=any_id)),
               g.add(Node("string")), g.add(Node("number")), g.add(Node("enum", literals=(b"true", b"false", b"null"))))
    g.nodes[any_id] = Node("union", members=members)
    return any_id


class _Compiler:
    def __init__(self) -> None:
        self.g = Grammar()
        self._any: int | None = None

    def any(self) -> int:
        if self._any is None:
            self._any = _add_any(self.g)
        return self._any

    def compile(self, schema: Any, where: str) -> int:
        if schema is True or schema == {}:
            return self.any()
        if not isinstance(schema, dict):
            raise SchemaError(f"{where}: a schema must be an object, got {json.dumps(schema)[:60]}")
        unknown = sorted(set(schema) - KEYWORDS)
        if unknown:
            raise SchemaError(f"{where}: keyword(s) {', '.join(map(repr, unknown))} are outside the supported "
                              f"JSON Schema subset ({SUBSET})")
        if "const" in schema or "enum" in schema:
            return self._enum(schema, where)
        types = schema.get("type")
        if types is None:
            types = "object" if "properties" in schema else "array" if "items" in schema else None
            if types is None:
                return self.any()
        if isinstance(types, list):
            return self._union(schema, types, where)
        return self._typed(schema, types, where)

    def _enum(self, schema: dict, where: str) -> int:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}/enum: must be a non-empty list of values")
        if "type" in schema:
            self._check_enum_types(values, schema["type"], where)
        lits = tuple(dict.fromkeys(literal(v, f"{where}/enum") for v in values))
        return self.g.add(Node("enum", literals=lits))

    @staticmethod
    def _check_enum_types(values: list, types: Any, where: str) -> None:
        allowed = types if isinstance(types, list) else [types]
        of = {bool: "boolean", type(None): "null", str: "string", int: "integer", float: "number", list: "array",
              dict: "object"}
        for v in values:
            t = of.get(type(v))
            if not (t in allowed or (t == "integer" and "number" in allowed)):
                raise SchemaError(f"{where}/enum: value {json.dumps(v)} is not of type {types}")

    def _union(self, schema: dict, types: list, where: str) -> int:
        if not types or len(set(map(str, types))) != len(types):
            raise SchemaError(f"{where}/type: a type list must be non-empty with no repeats, got {types}")
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        if len(types) == 1:
            return self._typed(schema, types[0], where)
        return self.g.add(Node("union", members=tuple(self._typed(schema, t, where) for t in types)))

    def _typed(self, schema: dict, t: Any, where: str) -> int:
        if t not in TYPES:
            raise SchemaError(f"{where}/type: {t!r} is not one of {', '.join(TYPES)}")
        if t == "object":
            return self._object(schema, where)
        if t == "array":
            items = schema.get("items", True)
            if isinstance(items, list):
                raise SchemaError(f"{where}/items: tuple validation (a list of schemas) is outside the subset")
            return self.g.add(Node("array", items=self.compile(items, f"{where}/items")))
        if t == "boolean":
            return self.g.add(Node("enum", literals=(b"true", b"false")))
        if t == "null":
            return self.g.add(Node("enum", literals=(b"null",)))
        return self.g.add(Node(t))

    def _object(self, schema: dict, where: str) -> int:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(props, dict) or not isinstance(required, list):
            raise SchemaError(f"{where}: properties must be an object and required a list of names")
        if extra not in (True, False):
            raise SchemaError(f"{where}/additionalProperties: only true or false is supported (no schema)")
        missing = [r for r in required if r not in props]
        if missing:
            raise SchemaError(f"{where}/required: {missing} are not in properties; every required name needs "
                              "a property schema")
        if not props and extra is True and "properties" not in schema:
            return self.g.add(Node("object", free=True, items=self.any()))
        compiled = tuple((literal(k, f"{where}/properties"), self.compile(v, f"{where}/properties/{k}"))
                         for k, v in props.items())
        mask = sum(1 << i for i, k in enumerate(props) if k in required)
        return self.g.add(Node("object", props=compiled, required=mask))


def min_lengths(g: Grammar) -> list[int]:
    """Shortest valid JSON text per node, by fixed-point iteration (the "any" nodes form cycles)."""
    inf = 1 << 30
    best = [inf] * len(g.nodes)
    changed = True
    while changed:
        changed = False
        for i, n in enumerate(g.nodes):
            if n.kind == "object" and not n.free:
                req = [(len(k), best[v]) for j, (k, v) in enumerate(n.props) if n.required >> j & 1]
                val = 2 + sum(a + 1 + b for a, b in req) + max(len(req) - 1, 0)
            else:
                val = {"string": 2, "number": 1, "integer": 1, "array": 2, "object": 2}.get(n.kind, inf)
                if n.kind == "enum":
                    val = min(len(x) for x in n.literals)
                elif n.kind in ("union", "alt"):
                    val = min(best[m] for m in n.members)
                elif n.kind == "seq":
                    val = sum(len(x) if isinstance(x, bytes) else best[x] for x in n.parts)
            if val < best[i]:
                best[i], changed = val, True
    return best


def compile_schema(schema: Any) -> Grammar:
    """The grammar of JSON texts valid under `schema` (SchemaError outside the subset)."""
    c = _Compiler()
    c.g.root = c.compile(schema, "#")
    c.g.min_len = min_lengths(c.g)
    return c.g


def any_object() -> Grammar:
    """The grammar of response_format json_object: any JSON object."""
    c = _Compiler()
    c.g.root = c.g.add(Node("object", free=True, items=c.any()))
    c.g.min_len = min_lengths(c.g)
    return c.g


def tagged_values(options: list[tuple[bytes, Any, bytes]], prefix: bytes = b"", suffix: bytes = b"") -> Grammar:
    """prefix, then one of the options (head literal, a value valid under a schema, tail literal), then suffix.
    The heads must differ before either ends (e.g. '{"name": "f", "arguments": ' for each tool f)."""
    if not options:
        raise SchemaError("tagged_values needs at least one option")
    heads = [h for h, _, _ in options]
    for a in heads:
        if any(a != b and b.startswith(a) for b in heads):
            raise SchemaError(f"option head {a!r} is a prefix of another; the options cannot be told apart")
    c = _Compiler()
    seqs = tuple(c.g.add(Node("seq", parts=tuple(x for x in (head, c.compile(schema, f"#/option/{i}"), tail) if x != b"")))
                 for i, (head, schema, tail) in enumerate(options))
    body = c.g.add(Node("alt", members=seqs))
    c.g.root = c.g.add(Node("seq", parts=tuple(x for x in (prefix, body, suffix) if x != b"")))
    c.g.min_len = min_lengths(c.g)
    return c.g
