"""Tokenizer files next to a model when converting between the HF and scratchlm layouts.

HF keeps the byte-level BPE tokenizer in `tokenizer.json` (+ `tokenizer_config.json`,
`special_tokens_map.json`). Conversion copies those files through byte for byte, and when the
tokenizer package's `scratchlm.tokenizer.hf_json` is available it also translates between
tokenizer.json and scratchlm's own tokenizer files (`Tokenizer.save(dir)` / `Tokenizer.load(dir)`).
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from scratchlm.io_utils import atomic_write

TOKENIZER_JSON = "tokenizer.json"
HF_TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json")


def _hf_json() -> ModuleType | None:
    """scratchlm.tokenizer.hf_json, or None while the tokenizer package does not provide it."""
    try:
        return importlib.import_module("scratchlm.tokenizer.hf_json")
    except ImportError:
        return None


def copy_file_atomic(src: Path, dst: Path) -> None:
    """Copy src to dst so that a reader never sees a half-written dst."""
    with open(src, "rb") as fin, atomic_write(dst) as fout:
        shutil.copyfileobj(fin, fout)


def copy_hf_tokenizer_files(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the HF tokenizer files present in src_dir to out_dir unchanged; return their names."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if src_dir.resolve() == out_dir.resolve():
        return []
    copied = [name for name in HF_TOKENIZER_FILES if (src_dir / name).is_file()]
    for name in copied:
        copy_file_atomic(src_dir / name, out_dir / name)
    return copied


def save_hf_tokenizer(tokenizer: Any, directory: str | Path) -> Path:
    """Write `tokenizer` (a scratchlm Tokenizer) as DIR/tokenizer.json through scratchlm.tokenizer.hf_json."""
    hf_json = _hf_json()
    if hf_json is None:
        raise ValueError("scratchlm.tokenizer.hf_json is not available in this install; cannot write tokenizer.json")
    path = Path(directory) / TOKENIZER_JSON
    hf_json.save_hf_tokenizer_json(tokenizer, path)
    return path


def load_hf_tokenizer(directory: str | Path) -> Any:
    """Load DIR/tokenizer.json (byte-level BPE) as a scratchlm Tokenizer."""
    path = Path(directory) / TOKENIZER_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the HF model directory has no tokenizer.json")
    hf_json = _hf_json()
    if hf_json is None:
        raise ValueError("scratchlm.tokenizer.hf_json is not available in this install; cannot read tokenizer.json")
    return hf_json.load_hf_tokenizer_json(path)


def tokenizer_from_hf(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """HF dir -> scratchlm dir: copy the HF tokenizer files and, when possible, write scratchlm's own."""
    written = copy_hf_tokenizer_files(src_dir, out_dir)
    if TOKENIZER_JSON in written and _hf_json() is not None:
        load_hf_tokenizer(src_dir).save(out_dir)
        written.append("scratchlm tokenizer files")
    return written


def tokenizer_to_hf(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """scratchlm dir -> HF dir: tokenizer.json from scratchlm's tokenizer files, else copied through."""
    src_dir = Path(src_dir)
    if (src_dir / TOKENIZER_JSON).is_file() or _hf_json() is None:
        return copy_hf_tokenizer_files(src_dir, out_dir)
    tokenizer_module = importlib.import_module("scratchlm.tokenizer")
    try:
        tok = tokenizer_module.Tokenizer.load(src_dir)
    except FileNotFoundError:
        return []
    save_hf_tokenizer(tok, out_dir)
    return [TOKENIZER_JSON]
