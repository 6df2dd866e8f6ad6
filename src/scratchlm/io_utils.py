"""Safe writes: atomic files, atomic output directories, and the output guard every command uses.

The rules (docs/cli.md), enforced here so every command follows them the same way:

1. Never write over something this run did not create. `check_output_path(path, kind, overwrite)`
   refuses a path that already holds a file or a non-empty directory unless `overwrite=True`
   (the CLI's `--overwrite`), and turns the usual OS surprises into one-line errors naming the path
   and the fix: a parent that is a file (NotADirectoryError), a directory where a file is expected
   (IsADirectoryError) or the reverse, an unwritable parent (PermissionError), an existing output
   (FileExistsError). An empty directory counts as free.
2. Files are written atomically: `atomic_write` writes a temp file beside the target, fsyncs it and
   `os.replace`s it, so a reader (or a crash) sees the old file or the complete new one.
3. Output directories are written as one atomic swap: `atomic_output_dir(path, overwrite)` yields a
   temp sibling directory; when the block succeeds its files are fsynced and the directory is
   swapped in (Linux `renameat2(RENAME_EXCHANGE)`: one atomic step; elsewhere two renames, with the
   old directory kept as `.NAME.old-PID` until the new one is in place); when it fails the temp
   directory is removed and `path` is untouched.
4. Run directories that fill up while a run works (`train`, `quickstart`) cannot be swapped at the end
   (a resumable run must live at its final path): `claim_run_dir(path, overwrite)` applies rule 1 and,
   with overwrite, moves the previous contents aside to `.NAME.replaced-PID` (one rename); the caller
   deletes them with `release_replaced` once the new run succeeded, so a failed run loses nothing.

How a CLI command uses it: declare each output flag with `scratchlm.cli.outputs.add_output_arg`; the
command line (`scratchlm.cli.main`) then checks every declared output before the command runs (so a
bad `--out` fails before minutes of work) and adds `--overwrite`; the command writes through
`atomic_output_dir` / `atomic_output_file` with `overwrite=args.overwrite`. Library callers get the
same refusal from those two functions.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

OUTPUT_KINDS = ("dir", "file")


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Context manager yielding a file object; on success the file atomically replaces `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)


def read_json_object(path: str | Path, missing: str) -> dict:
    """The JSON object in `path`; FileNotFoundError(`missing`) if absent, ValueError naming the file if corrupt."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(missing)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is corrupt") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_safetensors(path: str | Path, device: str = "cpu") -> dict[str, Any]:
    """All tensors of a safetensors file {name: tensor}; ValueError naming a truncated or foreign file."""
    from safetensors.torch import load_file  # torch is imported only by the code that reads weights

    try:
        return load_file(str(path), device=device)
    except Exception as exc:  # safetensors raises its own error types on truncated files
        raise ValueError(f"cannot read {path}: {exc} (truncated or not a safetensors file?)") from None


def _describe(path: Path) -> str:
    if path.is_dir():
        names = sorted(p.name for p in path.iterdir())
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({shown})"
    return f"a file of {path.stat().st_size:,} bytes"


def holds_something(path: str | Path) -> bool:
    """True if `path` is a file (or other non-directory) or a non-empty directory."""
    path = Path(path)
    if path.is_dir():
        return any(path.iterdir())
    return os.path.lexists(path)


def check_output_path(path: str | Path, kind: str = "dir", overwrite: bool = False, flag: str = "--out") -> Path:
    """Refuse to write `path` (a "dir" or a "file") when that would lose or mix data; see module rule 1.

    Raises one-line OSErrors naming `flag`, the path and the fix; returns the path when writing is safe."""
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {OUTPUT_KINDS}")
    path = Path(path)
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(f"{flag} {path}: {parent} is a file, not a directory; choose a path "
                                     "whose parents are directories")
    if path.exists() or path.is_symlink():
        if kind == "dir" and not path.is_dir():
            raise NotADirectoryError(f"{flag} {path} is a file, but a directory is written there; "
                                     "give a directory path")
        if kind == "file" and path.is_dir():
            raise IsADirectoryError(f"{flag} {path} is a directory, but a file is written there; "
                                    f"give a file path such as {path / 'NAME'}")
        if holds_something(path) and not overwrite:
            raise FileExistsError(f"{flag} {path} already holds {_describe(path)}; pass --overwrite to replace "
                                  "it or choose another path (nothing was changed)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise PermissionError(f"{flag} {path}: {existing} is not writable; choose another path or fix its permissions")
    return path


def _fsync_tree(root: Path) -> None:
    """fsync every file under `root` (writers such as safetensors' save_file do not)."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def exchange_paths(a: Path, b: Path) -> bool:
    """Atomically exchange two paths with Linux renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def swap_in_dir(new: Path, path: Path) -> None:
    """Put the complete directory `new` at `path`, replacing what is there (module rule 3)."""
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        os.replace(new, path)  # rename over an empty directory is atomic on POSIX
        return
    if exchange_paths(new, path):
        shutil.rmtree(new)
        return
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(path, old)
    os.replace(new, path)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(path: str | Path, overwrite: bool = False, flag: str = "--out") -> Iterator[Path]:
    """Yield a temp sibling of `path` to fill; on success it is swapped in as `path` (module rule 3)."""
    path = check_output_path(path, "dir", overwrite, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700 directories
        yield tmp
        _fsync_tree(tmp)
        check_output_path(path, "dir", overwrite, flag)  # still free: nothing appeared there meanwhile
        swap_in_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_output_file(path: str | Path, overwrite: bool = False, flag: str = "--out",
                       mode: str = "wb") -> Iterator[IO]:
    """`atomic_write` behind the output guard: refuses an existing `path` unless overwrite."""
    path = check_output_path(path, "file", overwrite, flag)
    with atomic_write(path, mode) as f:
        yield f


def claim_run_dir(path: str | Path, overwrite: bool = False, flag: str = "--out") -> Path | None:
    """Make `path` free for a run that fills it as it goes (module rule 4): afterwards it is absent or an
    empty directory; the run's first write creates it, so a run that fails before writing leaves nothing.

    Returns where the previous contents were moved (overwrite=True only), else None."""
    path = check_output_path(path, "dir", overwrite, flag)
    replaced = None
    if holds_something(path):
        replaced = path.parent / f".{path.name}.replaced-{os.getpid()}"
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(path, replaced)
        print(f"--overwrite: moved the previous contents of {path} to {replaced}; they are deleted when "
              "this run succeeds", file=sys.stderr)
    return replaced


def release_replaced(replaced: Path | None) -> None:
    """Delete what `claim_run_dir` moved aside, once the new run has succeeded."""
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
