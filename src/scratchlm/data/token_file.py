"""Token files: a flat little-endian array of token ids plus a JSON sidecar.

    FILE.bin       raw ids, dtype uint16 when vocab_size <= 65536 else uint32
    FILE.bin.json  {"dtype": "uint16", "n_tokens": N, "vocab_size": V}

Written atomically; read back as a read-only numpy memmap (constant memory, any size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np

from scratchlm.io_utils import atomic_write, atomic_write_text, check_output_path, read_json_object

TOKEN_DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 if every id < 2**16 fits, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size > 2**32:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint32 token files (limit 2**32)")
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def meta_path(path: str | Path) -> Path:
    return Path(str(path) + ".json")


def write_token_file(path: str | Path, chunks: Iterable[Iterable[int]], vocab_size: int,
                     overwrite: bool = True) -> int:
    """Stream chunks of ids to `path` atomically; returns the number of tokens written.

    overwrite=False refuses an existing FILE or FILE.json (the CLI's rule; scratchlm.io_utils)."""
    dtype = token_dtype(vocab_size)
    if not overwrite:
        check_output_path(path, "file", False)
        check_output_path(meta_path(path), "file", False)
    n = 0
    with atomic_write(path, "wb") as f:
        for chunk in chunks:
            arr = np.asarray(list(chunk) if not isinstance(chunk, np.ndarray) else chunk, dtype=np.int64)
            if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
                raise ValueError(f"token id {int(arr.max())} out of range for vocab_size {vocab_size}")
            f.write(arr.astype(dtype.newbyteorder("<")).tobytes())
            n += arr.size
    atomic_write_text(meta_path(path), json.dumps({"dtype": dtype.name, "n_tokens": n, "vocab_size": vocab_size}) + "\n")
    return n


def read_token_meta(path: str | Path) -> dict:
    """The sidecar metadata; a clear error if the file or sidecar is missing or inconsistent."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"token file {path} does not exist; create it with `scratchlm tokenizer encode`")
    if path.is_dir():
        raise IsADirectoryError(f"token file {path} is a directory; give the FILE.bin written by `scratchlm tokenizer encode`")
    mp = meta_path(path)
    if not mp.exists():
        raise FileNotFoundError(f"token file {path} has no metadata {mp}; re-create it with `scratchlm tokenizer encode`")
    meta = _check_meta(read_json_object(mp, f"token file {path} has no metadata {mp}"), mp)
    itemsize = np.dtype(meta["dtype"]).itemsize
    size = path.stat().st_size
    if size != meta["n_tokens"] * itemsize:
        raise ValueError(
            f"token file {path} has {size} bytes but its metadata says {meta['n_tokens']} x {meta['dtype']} "
            f"= {meta['n_tokens'] * itemsize} bytes (truncated or overwritten?)"
        )
    return meta


def _check_meta(meta: dict, mp: Path) -> dict:
    """The sidecar's fields, each checked: dtype uint16/uint32 wide enough for vocab_size, counts >= 0."""
    fix = "re-create it with `scratchlm tokenizer encode`"
    for key in ("dtype", "n_tokens", "vocab_size"):
        if key not in meta:
            raise ValueError(f"token file metadata {mp} has no {key!r} field; {fix}")
    for key in ("n_tokens", "vocab_size"):
        v = meta[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "n_tokens" else 1):
            raise ValueError(f"token file metadata {mp}: {key} must be a {'non-negative' if key == 'n_tokens' else 'positive'} "
                             f"integer, got {v!r}; {fix}")
    if meta["dtype"] not in TOKEN_DTYPES:
        raise ValueError(f"token file metadata {mp}: dtype {meta['dtype']!r} is not a token id type "
                         f"(valid: {', '.join(TOKEN_DTYPES)}); {fix}")
    if meta["vocab_size"] > np.iinfo(np.dtype(meta["dtype"])).max + 1:
        raise ValueError(f"token file metadata {mp}: vocab_size {meta['vocab_size']} does not fit dtype "
                         f"{meta['dtype']}; {fix}")
    return meta


def open_token_file(path: str | Path) -> np.memmap | np.ndarray:
    """Read-only memmap of the ids (an empty array for an empty file)."""
    meta = read_token_meta(path)
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    if meta["n_tokens"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(meta["n_tokens"],))
