"""The examples of README.md and docs/*.md work as written (docs/testing.md, "The examples in the docs are tested").

  * blocks marked `<!-- doc-test -->` run: each guide's in order, in a working directory of its own holding
    tiny fixtures (a 60 kB corpus at ../shared/data, the GPT-2 tokenizer files, a quickstart run on that
    corpus at runs/quickstart), with the venv's `scratchlm` and `python` first on PATH; each must exit 0;
  * every `scratchlm ...` line of every bash block parses with the real command-line parser;
  * every `from scratchlm... import` of a python block, and every `scratchlm.x.y` named in the text, resolves;
    every backticked source path and every relative link (and its #anchor) exists;
  * every command of `scratchlm --help` has an example in a guide, and a tested one unless it needs a server;
  * the README's package map lists the package's top-level modules in the layer order of tests/layout.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "scratchlm"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- doc-test -->"
RUNNABLE = {"bash", "python"}
NEEDS_A_SERVER = {("serve",)}  # commands whose examples cannot run to completion on the fixtures
CORPUS_CHARS = 60_000
BLOCK_TIMEOUT_S = 300
WORKERS = 2


@dataclasses.dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marked: bool

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def parse_blocks(doc: Path) -> list[Block]:
    """The fenced code blocks of a markdown file; a block is marked when the line before its fence is MARK."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = re.fullmatch(r"```(\S*)\s*", lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{doc.name}:{i + 1}: code block never closed")
        marked = i > 0 and lines[i - 1].strip() == MARK
        blocks.append(Block(doc, i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n", marked))
        i = end + 1
    return blocks


BLOCKS = {doc: parse_blocks(doc) for doc in DOCS}
GUIDES_WITH_TESTS = [doc for doc in DOCS if any(b.marked for b in BLOCKS[doc])]


def test_every_mark_sits_right_before_a_bash_or_python_block() -> None:
    wrong = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        for k, line in enumerate(lines):
            if line.strip() == MARK and (k + 1 == len(lines) or lines[k + 1].strip() not in {"```bash", "```python"}):
                wrong.append(f"{doc.name}:{k + 1}")
    assert not wrong, f"{MARK} must be the line right before a ```bash or ```python block: {wrong}"
    assert sum(b.marked for blocks in BLOCKS.values() for b in blocks) >= 10, "the marks are gone?"


# ---------------------------------------------------------------- running the marked blocks


@pytest.fixture(scope="session")
def doc_workspace(tmp_path_factory, shared_data: Path) -> Path:
    """ROOT/shared/data (a corpus cut + GPT-2 tokenizer files) and ROOT/template/runs/quickstart, trained here."""
    from scratchlm.train.quickstart import quickstart

    root = tmp_path_factory.mktemp("doc_commands")
    data = root / "shared" / "data"
    data.mkdir(parents=True)
    text = (shared_data / "tinyshakespeare.txt").read_text(encoding="utf-8")[:CORPUS_CHARS]
    (data / "tinyshakespeare.txt").write_text(text, encoding="utf-8")
    for name in ("gpt2_vocab.json", "gpt2_merges.txt"):
        shutil.copy(shared_data / name, data / name)
    template = root / "template"
    template.mkdir()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # the layout `scratchlm quickstart` writes, at a size that trains in a second
        quickstart(template / "runs" / "quickstart", data=str(data / "tinyshakespeare.txt"), minutes=1.0,
                   vocab_size=320, progress=False, max_steps=30, warmup_steps=3, batch_size=4, seq_len=32,
                   eval_interval=15, eval_batches=1, ckpt_interval=30, log_interval=5, peak_gflops=1.0,
                   **{"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1})
    finally:
        torch.set_num_threads(threads)
    return root


def _bin_dir() -> Path:
    """The venv's bin directory: the `python` running the tests and its `scratchlm` console script."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "scratchlm").exists():
        raise FileNotFoundError(f"no scratchlm console script in {bin_dir}; pip install -e . into this venv")
    return bin_dir


@dataclasses.dataclass
class Ran:
    block: Block
    returncode: int
    output: str
    seconds: float


def run_guide(doc: Path, root: Path) -> list[Ran]:
    """Run the marked blocks of `doc` in order, in a fresh copy of the template workspace."""
    work = root / f"work-{doc.stem}"
    shutil.copytree(root / "template", work)
    bin_dir = _bin_dir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "SCRATCHLM_KERNELS": "0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    out = []
    for block in (b for b in BLOCKS[doc] if b.marked):
        argv = (["bash", "-c", "set -euo pipefail\n" + block.code] if block.lang == "bash"
                else [str(bin_dir / "python"), "-c", block.code])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S)
            code, text = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, text = -1, f"timed out after {BLOCK_TIMEOUT_S} s\n{exc.output or ''}"
        out.append(Ran(block, code, text, time.perf_counter() - t0))
        if code != 0:
            break  # later blocks of a guide build on the earlier ones
    return out


@pytest.fixture(scope="session")
def guide_runs(request, doc_workspace: Path):
    """The selected guides' blocks, run WORKERS guides at a time (longest guides first)."""
    selected = {item.callspec.params["doc"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_marked_blocks_run" and hasattr(item, "callspec")}
    docs = sorted((d for d in GUIDES_WITH_TESTS if d.name in selected),
                  key=lambda d: -sum(b.code.count("scratchlm ") + 1 for b in BLOCKS[d] if b.marked))
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures: dict[str, Future] = {d.name: pool.submit(run_guide, d, doc_workspace) for d in docs}
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.parametrize("doc", [d.name for d in GUIDES_WITH_TESTS])
def test_marked_blocks_run(doc: str, guide_runs) -> None:
    ran = guide_runs[doc].result()
    expected = [b for d in GUIDES_WITH_TESTS if d.name == doc for b in BLOCKS[d] if b.marked]
    for r in ran:
        assert r.returncode == 0, (f"{r.block.where}: exit {r.returncode} after {r.seconds:.1f} s\n"
                                   f"--- block\n{r.block.code}--- output (tail)\n{r.output[-4000:]}")
    assert len(ran) == len(expected)


# ---------------------------------------------------------------- every documented command line parses

PUNCT = re.compile(r"^[|&;()<>]+$")
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


def scratchlm_argvs(code: str) -> list[list[str]]:
    """The argument lists after `scratchlm` / `-m scratchlm` / `-m scratchlm.cli.main` in a bash block:
    continuation lines joined, comments dropped, up to the next shell operator; [optional] brackets removed."""
    argvs = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:  # an unclosed quote: a heredoc body, not a command
            continue
        command_position = True  # at the start of a line or after an operator, env assignments skipped
        for k, tok in enumerate(tokens):
            starts = (tok == "scratchlm" and command_position) or (
                tok in ("scratchlm", "scratchlm.cli.main") and k > 0 and tokens[k - 1] == "-m")
            command_position = bool(PUNCT.match(tok)) or (command_position and ASSIGNMENT.match(tok) is not None)
            if not starts:
                continue
            argv = []
            for t in tokens[k + 1:]:
                if PUNCT.match(t):
                    break
                t = t.strip("[]") if t.startswith("[") or t.endswith("]") else t
                if t:
                    argv.append(t)
            argvs.append(argv)
    return argvs


def _overrides_error(extra: list[str]) -> str | None:
    """The --key=value overrides of train/quickstart must name TrainConfig (or model.ModelConfig) fields."""
    from scratchlm.config import ModelConfig
    from scratchlm.train.train_config import TrainConfig, parse_cli_overrides

    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = [k for k in parse_cli_overrides(extra)
               if not (k in train_fields or k.startswith("model.") and k[len("model."):] in model_fields)]
    return f"unknown config fields {unknown}" if unknown else None


def parse_error(parser, argv: list[str]) -> str | None:
    """None if the real CLI parser accepts `argv` (as cli/main.py parses it), else the error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip() or f"exit {exc.code}"
    if extra and not getattr(args, "accepts_overrides", False):
        return f"unrecognized arguments: {' '.join(extra)}"
    return _overrides_error(extra) if extra else None


@pytest.fixture(scope="module")
def cli_parser():
    from scratchlm.cli.main import build_parser

    return build_parser()


def test_argv_extraction() -> None:
    code = ("A=1 scratchlm tokenizer train --input a.txt --out t  # comment\n"
            "printf 'x' | scratchlm chat --checkpoint d --system \"be # terse\" > out.txt\n"
            "python -m scratchlm train --preset smoke \\\n    --lr=3e-4 [--max_steps=5]\n"
            "torchrun -m scratchlm.cli.main train --config run.json && echo scratchlm done\n")
    assert scratchlm_argvs(code) == [["tokenizer", "train", "--input", "a.txt", "--out", "t"],
                                     ["chat", "--checkpoint", "d", "--system", "be # terse"],
                                     ["train", "--preset", "smoke", "--lr=3e-4", "--max_steps=5"],
                                     ["train", "--config", "run.json"]]


def test_parse_check_catches_bad_options(cli_parser) -> None:
    assert parse_error(cli_parser, ["generate", "--checkpoint", "d", "--prompt", "x", "--prefill", "bf16"]) is None
    assert parse_error(cli_parser, ["train", "--preset", "smoke", "--lr=3e-4", "--model.n_layers=2"]) is None
    assert "--no-such-flag" in parse_error(cli_parser, ["generate", "--checkpoint", "d", "--prompt", "x", "--no-such-flag"])
    assert "invalid choice" in parse_error(cli_parser, ["serve", "--checkpoint", "d", "--prefill", "fp8"])
    assert "lrr" in parse_error(cli_parser, ["train", "--preset", "smoke", "--lrr=3e-4"])


def test_every_documented_command_line_parses(cli_parser) -> None:
    bad, seen = [], 0
    for doc in DOCS:
        for block in BLOCKS[doc]:
            if block.lang != "bash":
                continue
            for argv in scratchlm_argvs(block.code):
                seen += 1
                error = parse_error(cli_parser, argv)
                if error:
                    bad.append(f"{block.where}: scratchlm {' '.join(argv)}\n    -> {error}")
    assert seen > 100, f"only {seen} command lines found; did the block format change?"
    assert not bad, "documented command lines the CLI rejects:\n" + "\n".join(bad)


# ---------------------------------------------------------------- every command has an example


def command_paths(parser) -> list[tuple[str, ...]]:
    """("info",), ("tokenizer", "train"), ... : every leaf command of the parser."""
    import argparse

    def walk(p, prefix):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [prefix]
        return [path for name, sub in subs[0].choices.items() for path in walk(sub, prefix + (name,))]

    return walk(parser, ())


def test_every_command_has_an_example_in_a_guide(cli_parser) -> None:
    documented, tested = set(), set()
    for doc in DOCS:
        for block in BLOCKS[doc]:
            if block.lang == "bash":
                for argv in scratchlm_argvs(block.code):
                    (tested if block.marked else documented).add(tuple(argv[:2]))
    documented |= tested
    leaves = command_paths(cli_parser)
    assert len(leaves) >= 16
    missing = [" ".join(p) for p in leaves if not any(d[:len(p)] == p for d in documented)]
    assert not missing, f"commands of `scratchlm --help` with no example in README.md or docs/*.md: {missing}"
    untested = sorted({p[:1] for p in leaves} - {t[:1] for t in tested} - NEEDS_A_SERVER)
    assert not untested, f"commands with no {MARK} example (mark one that runs on the fixtures): {untested}"


# ---------------------------------------------------------------- names, paths and links in the text

SOURCE_SUFFIXES = (".py", ".h", ".cpp", ".md", ".toml", ".sh", ".html")
TOP_LEVEL = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def _resolve_path(ref: str, doc: Path) -> bool:
    """Whether a path named in backticks exists: from the repo root, src/, src/scratchlm/ or the doc's
    folder; a bare file name anywhere in src/, tests/ or benchmarks/; globs allowed (families*.py)."""
    bases = [ROOT, ROOT / "src", PACKAGE, doc.parent]
    if "/" not in ref.rstrip("/"):
        return (ROOT / ref).exists() or any(any(top.rglob(ref.rstrip("/"))) for top in (PACKAGE, ROOT / "tests", ROOT / "benchmarks", ROOT / "docs"))
    return any(any(base.glob(ref.rstrip("/"))) if "*" in ref else (base / ref).exists() for base in bases)


def _checked_path(ref: str) -> bool:
    if ref.endswith(SOURCE_SUFFIXES):
        return not ref.startswith(("~", "/"))
    first = ref.split("/")[0]
    return ref.endswith("/") and (first in {"src", "tests", "benchmarks", "docs", "scripts"} or first in TOP_LEVEL)


def _symbol_defined(path: Path, symbol: str) -> bool:
    return bool(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{symbol}\b|^{symbol}\s*[:=]",
                          path.read_text(encoding="utf-8"), re.M))


def test_named_paths_exist() -> None:
    missing, checked = [], 0
    for doc in DOCS:
        if doc.name.startswith("concepts"):
            continue  # tests/docs/test_concepts_index.py checks those
        for ref in re.findall(r"`([^`\s]+)`", doc.read_text(encoding="utf-8")):
            path, _, symbol = ref.partition("::")
            if not _checked_path(path):
                continue
            checked += 1
            if not _resolve_path(path, doc):
                missing.append(f"{doc.name}: {ref}")
            elif symbol and not any(_symbol_defined(base / path, symbol)
                                    for base in (ROOT, ROOT / "src", PACKAGE) if (base / path).is_file()):
                missing.append(f"{doc.name}: {ref} (no such symbol)")
    assert checked > 150, f"only {checked} paths checked; did the format change?"
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+\s+(.+)$", text, re.M)}


def test_relative_links_and_anchors_exist() -> None:
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"


def _resolve_dotted(name: str) -> bool:
    """scratchlm.a.b.c: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _expand_braces(name: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in _expand_braces(name[:m.start()] + alt + name[m.end():])]


def test_python_names_resolve() -> None:
    """Imports in python blocks, `scratchlm.name` uses in them, and `scratchlm.x.y` named in the text."""
    bad, checked = [], 0
    for doc in DOCS:
        if doc.name.startswith("concepts"):
            continue
        names: list[tuple[str, str]] = []
        for block in BLOCKS[doc]:
            if block.lang != "python":
                continue
            for node in ast.walk(ast.parse(block.code)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "scratchlm":
                    names += [(block.where, f"{node.module}.{a.name}") for a in node.names]
                elif isinstance(node, ast.Import):
                    names += [(block.where, a.name) for a in node.names if a.name.split(".")[0] == "scratchlm"]
                elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id == "scratchlm"):
                    names.append((block.where, f"scratchlm.{node.attr}"))
        text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
        for ref in re.findall(r"`(scratchlm\.[\w.{},]+)", text):
            names += [(doc.name, n.rstrip(".")) for n in _expand_braces(ref)]
        for where, name in names:
            checked += 1
            if not _resolve_dotted(name):
                bad.append(f"{where}: {name}")
    assert checked > 40, f"only {checked} names checked"
    assert not bad, "names in the docs that do not resolve:\n" + "\n".join(bad)


# ---------------------------------------------------------------- the README's package map


def _layers() -> dict[str, int]:
    spec = importlib.util.spec_from_file_location("_layout_rules", ROOT / "tests" / "layout" / "test_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


def test_readme_package_map_follows_the_layers() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Package map", 1)[1]
    block = section.split("```", 2)[1]
    rows = re.findall(r"^\s+(\d+)\s+(\S+)", block, re.M)
    units = [(int(layer), name.removesuffix("/").removesuffix(".py")) for layer, name in rows]
    layers = _layers()
    assert {u for _, u in units} == set(layers), (
        f"README package map vs LAYERS: only in the map {sorted({u for _, u in units} - set(layers))}, "
        f"missing from it {sorted(set(layers) - {u for _, u in units})}")
    wrong = [f"{u}: map says {n}, LAYERS {layers[u]}" for n, u in units if layers[u] != n]
    assert not wrong, wrong
    assert [n for n, _ in units] == sorted(n for n, _ in units), "list the map low -> high"
