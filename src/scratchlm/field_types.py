"""Type checks for config dataclasses (TrainConfig, ModelConfig), so a wrong type is a clear ValueError.

Values arrive from JSON files and `--key=value` flags (parsed as JSON when they parse, else kept as
strings), so `--lr=fast` arrives as the string "fast" and `--compile=maybe` as "maybe". Each field's
annotation says what is valid; `check_field_types` raises `ValueError("Config.field must be ..., got
...")` before any arithmetic can fail with a TypeError deep inside. Booleans are strict: True/False,
or one of the spellings in BOOL_WORDS (case-insensitive), which are converted; anything else
(`"maybe"`, `2`) is an error. Integers are not booleans; floats accept integers.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
              "on": True, "off": False}
_TYPE_NAMES = {"bool", "int", "float", "str", "dict", "list", "tuple", "None"}


def parse_bool(value: Any, name: str) -> bool:
    """Strict boolean: a bool, 0/1, or a word in BOOL_WORDS; ValueError naming `name` otherwise."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy's bool too
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
        return BOOL_WORDS[value.strip().lower()]
    raise ValueError(f"{name} must be true or false, got {value!r} (accepted: {', '.join(BOOL_WORDS)})")


def _allowed(annotation: Any) -> set[str] | None:
    """{"int", "None"} for "int | None"; None when the annotation is not a simple one we check."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    names = {part.strip().split("[", 1)[0] for part in text.split("|")}
    return names if names <= _TYPE_NAMES else None


def _matches(value: Any, kind: str) -> bool:
    if kind == "None":
        return value is None
    if kind == "int":  # numbers.Integral/Real: numpy scalars (e.g. from GGUF metadata) count too
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, {"bool": bool, "str": str, "dict": dict, "list": list, "tuple": (tuple, list)}[kind])


def _describe(kinds: set[str]) -> str:
    words = {"int": "an integer", "float": "a number", "str": "a string", "dict": "an object",
             "list": "a list", "tuple": "a list", "None": "null", "bool": "true or false"}
    return " or ".join(words[k] for k in sorted(kinds, key=lambda k: k == "None"))


def check_field_types(obj: Any) -> None:
    """Check (and for booleans normalise) every init field of dataclass `obj` against its annotation."""
    cls = type(obj).__name__
    for f in dataclasses.fields(obj):
        kinds = _allowed(f.type) if f.init else None
        if not kinds:
            continue
        value = getattr(obj, f.name)
        if "bool" in kinds and not isinstance(value, bool) and not (value is None and "None" in kinds):
            setattr(obj, f.name, parse_bool(value, f"{cls}.{f.name}"))
            continue
        if not any(_matches(value, k) for k in kinds):
            raise ValueError(f"{cls}.{f.name} must be {_describe(kinds)}, got {value!r}")
