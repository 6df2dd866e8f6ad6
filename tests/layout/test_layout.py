"""The package's layout rules, read from the code's own imports (every import: top-level, inside
functions, under TYPE_CHECKING):

  * lower layers never import higher ones (LAYERS below; README.md "Package map" draws the same order),
  * no import circles between modules, not even type-only ones,
  * no two modules share a basename, except cli/NAME.py, the command that fronts the library module NAME.py,
  * exactly one module looks at a path to tell model kinds apart (scratchlm/load/kinds.py).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "scratchlm"

# top-level package or module -> layer; an import must go to a strictly lower layer (or stay inside its unit)
LAYERS = {
    "io_utils": 0, "field_types": 0, "quant": 0, "config_checks": 0,
    "tokenizer": 1, "kernels": 1,
    "nn": 2,
    "config": 3,
    "model": 4, "model_stats": 4, "data": 4,
    "model_files": 5, "generate": 5,
    "interop": 6, "train": 6, "viz": 6,
    "load": 7, "align": 7,
    "serve": 8, "eval": 8,
    "cli": 9,
    "__main__": 10, "__init__": 10,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _exists(module: str) -> bool:
    p = PACKAGE.parent / module.replace(".", "/")
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """The scratchlm modules `path` imports (a `from pkg import name` of a submodule counts as that module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "scratchlm":
            subs = [f"{node.module}.{a.name}" for a in node.names if _exists(f"{node.module}.{a.name}")]
            out.update(subs if len(subs) == len(node.names) else [node.module, *subs])
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "scratchlm")
    return {m for m in out if _exists(m)}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        # importing a.b.c runs a/__init__ and a/b/__init__ too; those edges are the package's own
        graph[name] = {m for m in _imports(path) if m != name and not name.startswith(m + ".")}
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in _graph()}
    assert units == set(LAYERS), f"add to / drop from LAYERS: {sorted(units ^ set(LAYERS))}"


def test_no_upward_imports() -> None:
    upward = sorted(f"{a} -> {b}" for a, deps in _graph().items() for b in deps
                    if _unit(a) != _unit(b) and LAYERS[_unit(b)] >= LAYERS[_unit(a)])
    assert not upward, "imports that do not go to a lower layer:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_no_twin_basenames() -> None:
    by_name = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            by_name[path.name].append(path.relative_to(PACKAGE).as_posix())
    twins = {n: sorted(ps) for n, ps in by_name.items() if len(ps) > 1}
    # cli/NAME.py is the command fronting the library module NAME.py (one other place at most)
    allowed = {n: ps for n, ps in twins.items() if len(ps) == 2 and sum(p.startswith("cli/") for p in ps) == 1}
    assert twins == allowed, f"modules sharing a basename: { {n: ps for n, ps in twins.items() if n not in allowed} }"


def test_one_module_tells_model_kinds_apart() -> None:
    sniffers = sorted(_module_name(p) for p in PACKAGE.rglob("*.py")
                      if any(s in p.read_text(encoding="utf-8") for s in ("is_gguf_file(", "is_hf_config(", "is_adapter_dir("))
                      and not p.name.startswith("__"))
    definers = {"scratchlm.interop.gguf.reader", "scratchlm.interop.hf.model_dir", "scratchlm.interop.hf.peft_adapter"}
    assert [m for m in sniffers if m not in definers] == ["scratchlm.load.kinds"]
