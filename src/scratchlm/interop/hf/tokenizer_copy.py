"""Tokenizer files next to a model when converting between the HF and scratchlm layouts.

HF keeps a tokenizer in `tokenizer.json` (+ `tokenizer_config.json`, `special_tokens_map.json`,
`chat_template.jinja`); scratchlm reads those directly (`scratchlm.tokenizer.load_pretrained_tokenizer`,
`Tokenizer.load(dir)`), and keeps its own trained tokenizers in its own files (`Tokenizer.save(dir)`),
which never clash with a model's config.json / model.safetensors / tokenizer.json.
  HF -> scratchlm: the HF files are copied byte for byte (and checked to load).
  scratchlm -> HF: existing HF files are copied byte for byte; otherwise scratchlm's tokenizer is
                   written as tokenizer.json + a tokenizer_config.json that AutoTokenizer understands.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from scratchlm.io_utils import atomic_write, atomic_write_text
from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.hf_files import load_pretrained_tokenizer

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
HF_TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, "special_tokens_map.json", "chat_template.jinja")


def copy_file_atomic(src: Path, dst: Path) -> None:
    """Copy src to dst so that a reader never sees a half-written dst."""
    with open(src, "rb") as fin, atomic_write(dst) as fout:
        shutil.copyfileobj(fin, fout)


def copy_hf_tokenizer_files(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the HF tokenizer files present in src_dir to out_dir unchanged; return their names."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    copied = [name for name in HF_TOKENIZER_FILES if (src_dir / name).is_file()]
    for name in copied:
        copy_file_atomic(src_dir / name, out_dir / name)
    return copied


def save_hf_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> Path:
    """Write a scratchlm Tokenizer as DIR/tokenizer.json + DIR/tokenizer_config.json (AutoTokenizer-loadable)."""
    directory = Path(directory)
    tokenizer.save_hf_json(directory / TOKENIZER_JSON)
    atomic_write_text(directory / TOKENIZER_CONFIG, json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")
    return directory / TOKENIZER_JSON


def load_hf_tokenizer(directory: str | Path) -> Tokenizer:
    """Load DIR/tokenizer.json as a scratchlm Tokenizer."""
    path = Path(directory) / TOKENIZER_JSON
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the HF model directory has no tokenizer.json")
    return Tokenizer.from_hf_json(path)


def tokenizer_from_hf(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """HF dir -> scratchlm dir: copy the tokenizer files; say so if scratchlm cannot run that tokenizer."""
    written = copy_hf_tokenizer_files(src_dir, out_dir)
    if TOKENIZER_JSON in written:
        try:
            load_pretrained_tokenizer(out_dir)
        except ValueError as exc:
            written.append(f"(scratchlm cannot run this tokenizer: {exc})")
    return written


def tokenizer_to_hf(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """scratchlm dir -> HF dir; returns what was written."""
    src_dir = Path(src_dir)
    if (src_dir / TOKENIZER_JSON).is_file():
        return copy_hf_tokenizer_files(src_dir, out_dir)
    try:
        tok = Tokenizer.load(src_dir)
    except FileNotFoundError:
        return []
    save_hf_tokenizer(tok, out_dir)
    return [TOKENIZER_JSON, TOKENIZER_CONFIG]
