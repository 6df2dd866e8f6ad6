"""The Jinja environment chat templates run in, built as transformers builds it, so a model's own
template renders here exactly as `tokenizer.apply_chat_template` renders it:

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) + loopcontrols ({% break %})
    filter  tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) = json.dumps
            (Jinja's own tojson would HTML-escape "<", ">", "&", "'")
    globals raise_exception(msg), strftime_now(fmt) = datetime.now().strftime(fmt),
            dict(...), namespace(...) (names starting with "_" refused)
    tag     {% generation %}...{% endgeneration %} renders its body and, while tracking, records the
            [start, end) chars of that body in the output (the assistant tokens SFT trains on)
Chat templates are untrusted code from model repositories: the sandbox keeps them away from Python
internals, and nothing they render is ever executed.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterator

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTracker(jinja2.ext.Extension):
    """The {% generation %} tag: output unchanged; records the char span of each block while active."""

    tags = {"generation"}

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment)
        environment.extend(track_generation=self.track)
        self._blocks: list[str] | None = None
        self._spans: list[tuple[int, int]] | None = None

    def parse(self, parser: Any) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_block"), [], [], body).set_lineno(lineno)

    def _block(self, caller: Any) -> str:
        text = caller()
        if self._blocks is not None:
            start = sum(map(len, self._blocks))
            self._spans.append((start, start + len(text)))
        return text

    @contextmanager
    def track(self, blocks: list[str], spans: list[tuple[int, int]]) -> Iterator[None]:
        """While active, `blocks` must receive every rendered chunk (so offsets can be counted)."""
        if self._blocks is not None:
            raise RuntimeError("a chat template is already being rendered with generation tracking")
        self._blocks, self._spans = blocks, spans
        try:
            yield
        finally:
            self._blocks = self._spans = None


def raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class TemplateDict:
    """`dict(...)` for templates, without attribute access to the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing "_"-prefixed names (no way to reach Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (cached per source text); a fresh environment per template."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ValueError(f"chat template does not parse: {exc} (line {exc.lineno})") from None
