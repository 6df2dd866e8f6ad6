"""The concept indexes (English and Chinese) name only paths and symbols that exist, and cover the same set."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "concepts.md", ROOT / "docs" / "concepts.zh.md"]
REF = re.compile(r"`((?:src|tests|benchmarks|docs)/[\w./-]+)(?:::(\w+))?`")


def references(doc: Path) -> set[tuple[str, str | None]]:
    return {(m.group(1), m.group(2)) for m in REF.finditer(doc.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_path_and_symbol_exists(doc: Path) -> None:
    refs = references(doc)
    assert len(refs) > 60, f"{doc.name}: only {len(refs)} references found; did the link format change?"
    missing = []
    for path, symbol in sorted(refs, key=str):
        target = ROOT / path
        if not target.exists():
            missing.append(path)
        elif symbol and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{symbol}\b|^{symbol}\s*[:=]",
                                      target.read_text(encoding="utf-8"), re.M):
            missing.append(f"{path}::{symbol}")
    assert not missing, f"{doc.name} names things that do not exist: {missing}"


def test_english_and_chinese_indexes_name_the_same_code_and_tests() -> None:
    en, zh = (references(d) for d in DOCS)
    assert en == zh, f"only in English: {sorted(en - zh, key=str)}; only in Chinese: {sorted(zh - en, key=str)}"
