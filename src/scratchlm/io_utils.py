"""Atomic file writes: write to a temp file in the target directory, fsync, then os.replace.

A reader (or a crash) never sees a half-written file: either the old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Context manager yielding a file object; on success the file atomically replaces `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)


def read_json_object(path: str | Path, missing: str) -> dict:
    """The JSON object in `path`; FileNotFoundError(`missing`) if absent, ValueError naming the file if corrupt."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(missing)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is corrupt") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
