"""Reading tokenizer.json components: exact field checks, so an option we do not implement is an error
that names it instead of a silently different tokenizer."""

from __future__ import annotations

from typing import Any


class UnsupportedTokenizerFeature(ValueError):
    """A tokenizer.json component or option that scratchlm does not implement."""


def check_fields(d: Any, where: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> dict:
    """`d` as a dict holding every required key and no key outside required + optional + "type"."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be a JSON object, got {d!r}")
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{where} ({d.get('type')}) lacks field(s) {missing}")
    extra = sorted(set(d) - set(required) - set(optional) - {"type"})
    if extra:
        raise UnsupportedTokenizerFeature(
            f"{where} {d.get('type')} has option(s) {extra} that scratchlm does not implement; "
            f"known options: {sorted(set(required) | set(optional))}"
        )
    return d


def unsupported_type(where: str, d: Any, supported: list[str]) -> UnsupportedTokenizerFeature:
    """The error for a component type we do not implement."""
    kind = d.get("type") if isinstance(d, dict) else d
    return UnsupportedTokenizerFeature(
        f"{where} type {kind!r} is not supported by scratchlm's tokenizer (supported: {', '.join(supported)})"
    )


def dispatch(d: Any, where: str, registry: dict[str, Any]) -> Any:
    """registry[d["type"]].from_json(d), or a clear error naming the unsupported type."""
    if not isinstance(d, dict) or d.get("type") not in registry:
        raise unsupported_type(where, d, sorted(registry))
    return registry[d["type"]].from_json(d, where)
