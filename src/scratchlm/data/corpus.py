"""Text corpora: the default corpus that exists on every machine, and the user's own text files.

Default corpus: the Python standard library's own sources (`*.py` under sysconfig's stdlib path,
tests and site-packages skipped, in sorted order) followed by the `pydoc_data` help topics, cut at
`max_bytes`. Both ship with every CPython, so no download is needed.
User data (`--data PATH`): a .txt file (UTF-8) or a .jsonl file with a "text" field per line, or a
directory of such files (sorted).
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
DOC_SEPARATOR = "\n\n"


def stdlib_sources() -> list[Path]:
    """Sorted .py files of the running interpreter's standard library (tests and site-packages skipped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(files)


def pydoc_topics() -> list[str]:
    """The help-topic texts of `pydoc_data.topics` (what `help('if')` prints), sorted by topic name."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _take(parts: list[str], text: str, budget: int) -> int:
    """Append text (cut to the remaining byte budget) and return the new budget."""
    data = text.encode("utf-8")[:budget].decode("utf-8", errors="ignore")
    parts.append(data)
    return budget - len(data.encode("utf-8")) - len(DOC_SEPARATOR)


def default_corpus(max_bytes: int = 4_000_000) -> str:
    """pydoc topics first (English prose), then stdlib sources, up to max_bytes of UTF-8 text."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    parts: list[str] = []
    budget = max_bytes
    for text in pydoc_topics():
        if budget <= 0:
            break
        budget = _take(parts, text, budget)
    for path in stdlib_sources():
        if budget <= 0:
            break
        budget = _take(parts, path.read_text(encoding="utf-8", errors="replace"), budget)
    return DOC_SEPARATOR.join(parts)


def read_text_file(path: Path) -> list[str]:
    """Documents of one file: the whole .txt, or the "text" field of each .jsonl line."""
    if path.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{n}: each .jsonl line must be an object with a string \"text\" field")
            docs.append(record["text"])
        return docs
    return [path.read_text(encoding="utf-8")]


def load_corpus(path: str | Path, max_bytes: int | None = None) -> str:
    """Text of a .txt/.jsonl file or a directory of them, joined with blank lines, optionally cut."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--data {path} does not exist; pass a .txt or .jsonl file or a directory of them")
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl")) if path.is_dir() else [path]
    text = DOC_SEPARATOR.join(doc for f in files for doc in read_text_file(f))
    if max_bytes is not None:
        text = text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
    if not text.strip():
        raise ValueError(f"--data {path} contains no text (found files: {[str(f) for f in files][:5]})")
    return text
