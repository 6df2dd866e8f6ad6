"""Every benchmark script imports as its documented command (`python benchmarks/NAME.py`) runs it.

Each script is loaded with importlib under a name other than "__main__" (so main() does not run), with
benchmarks/ first on sys.path as Python puts a script's folder there. That runs the module-level imports.
The imports inside functions (which only run when the benchmark runs: the real-model fixture's locator,
peft, llama.cpp's bindings ...) are then resolved too, from the script's AST: every `import M` /
`from M import a, b` must find M, and a, b must exist in it (an attribute or a submodule), with the
folders the script itself puts on sys.path (`sys.path.insert(0, EXPR)`, EXPR evaluated in the module).
So a moved helper (smollm2_fixture went from benchmarks/ to tests/) or a renamed function fails here.
Each script's command line is then parsed with --help (usage printed, exit 0).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS, TESTS = REPO / "benchmarks", REPO / "tests"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def _guarded_by_import_error(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Is `node` inside a try whose handlers catch ImportError/ModuleNotFoundError (an optional import)?"""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for h in node.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
                if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names):
                    return True
    return False


def script_imports(tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every unguarded absolute import statement in the script."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and not _guarded_by_import_error(node, parents):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            if not _guarded_by_import_error(node, parents):
                found.append((node.module, [a.name for a in node.names if a.name != "*"], node.lineno))
    return found


def path_inserts(tree: ast.Module) -> list[ast.expr]:
    """The EXPR of every `sys.path.insert(i, EXPR)` in the script (module level or inside functions)."""
    return [node.args[1] for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "insert"
            and ast.unparse(node.func.value) == "sys.path" and len(node.args) == 2]


def _is_submodule(package: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{package}.{name}") is not None
    except ImportError:  # package is a plain module
        return False


def test_every_benchmark_is_covered():
    assert {"grpo_toy.py", "lora_finetune.py", "train_step.py", "serve_load.py"} <= {p.name for p in SCRIPTS}


def _repo_local(path: str | None) -> bool:
    """A path under the repo's tests/ or benchmarks/, or the repo root itself (what pytest adds to sys.path)."""
    if not path:
        return path == ""  # "" is the working directory, not on a script's path
    p = Path(path).resolve()
    return p == REPO or p.is_relative_to(TESTS) or p.is_relative_to(BENCHMARKS)


@pytest.fixture
def script_sys_path(monkeypatch):
    """sys.path and sys.modules as `python benchmarks/NAME.py` sees them: benchmarks/ first, none of the
    folders pytest added (tests/, tests/benchmarks/, the repo root), no test helper already imported."""
    for name, mod in list(sys.modules.items()):
        where = getattr(mod, "__file__", None)
        if where is None:
            try:  # a namespace package's path recomputes from its parent, which may be gone: skip it then
                where = next(iter(getattr(mod, "__path__", None) or []), None)
            except KeyError:
                where = None
        if where and _repo_local(str(Path(where).parent)):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), *(p for p in sys.path if not _repo_local(p))])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:  # what the script imported from the repo's folders goes again
        where = getattr(sys.modules[name], "__file__", None)
        if where and _repo_local(str(Path(where).parent)):
            del sys.modules[name]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_imports(script, script_sys_path, monkeypatch, capsys):
    tree = ast.parse(script.read_text(), str(script))
    if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):  # a script, not a helper
        assert any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body), (
            f"{script.name} has no `if __name__ == '__main__':` guard; importing it would run the benchmark")
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # module-level imports and path set-up; main() is not called
    for expr in path_inserts(tree):
        folder = str(eval(compile(ast.Expression(expr), str(script), "eval"), vars(module)))
        if folder not in sys.path:
            sys.path.insert(0, folder)
    for name, names, line in script_imports(tree):
        try:
            target = importlib.import_module(name)
        except ImportError as e:
            pytest.fail(f"{script.name}:{line}: import {name} fails: {e}", pytrace=False)
        for attr in names:
            if not hasattr(target, attr) and not _is_submodule(name, attr):
                pytest.fail(f"{script.name}:{line}: {name} has no {attr!r}", pytrace=False)
    if hasattr(module, "main"):  # its command line parses: --help prints usage and exits 0 before any work
        monkeypatch.setattr(sys, "argv", [str(script), "--help"])
        with pytest.raises(SystemExit) as exited:
            module.main()
        assert exited.value.code == 0 and "usage:" in capsys.readouterr().out
