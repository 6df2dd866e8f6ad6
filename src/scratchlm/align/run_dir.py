"""The output directory of a post-training run: claimed at the start, published as one swap at the end.

    prepare_run_dir(out, base, resume, overwrite)
        refuses an --out that is, contains or lies inside the starting --checkpoint (the base model is
        never written over), an --out that holds anything unless --resume (which needs a checkpoint
        there) or --overwrite (the old contents are moved aside and deleted only once the new run
        succeeded); returns where the old contents went.
    publish_run_dir(out, fill)
        fill(tmp) writes the final model into a fresh sibling directory, which then replaces `out` —
        checkpoints included — in one swap: a reader (or a crash) sees the run directory with its last
        checkpoint, or the finished output, never new weights beside an old config.
While the run works, `out` holds only `out/checkpoint` (align.checkpoint), so --resume finds it.
The swap uses two renames; between them the previous directory waits at `.NAME.old-PID`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from scratchlm.train.checkpoint import find_checkpoint


def _holds_something(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir()) or (path.exists() and not path.is_dir())


def _check_not_base(out: Path, base: Path | None) -> None:
    if base is None:
        return
    o, b = out.resolve(), base.resolve()
    if o == b or b in o.parents or o in b.parents:
        relation = "is" if o == b else ("lies inside" if b in o.parents else "contains")
        raise ValueError(f"--out {out} {relation} the starting --checkpoint {base}; writing there would replace "
                         "the model this run starts from: choose another --out")


def prepare_run_dir(out: str | Path, base: str | Path | None = None, resume: bool = False,
                    overwrite: bool = False) -> Path | None:
    """Check and claim `out` for a run (module docstring); returns the moved-aside old contents, if any."""
    out = Path(out)
    _check_not_base(out, Path(base) if base is not None else None)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it; pass only one")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, but the run writes a directory there; give a directory path")
    if resume:
        if find_checkpoint(out) is None:
            raise FileNotFoundError(f"--resume: {out} holds no checkpoint to continue (a finished run publishes "
                                    "its model and drops its checkpoints); start without --resume")
        return None
    if not _holds_something(out):
        out.mkdir(parents=True, exist_ok=True)
        return None
    if not overwrite:
        what = ("a checkpoint of an unfinished run: pass --resume to continue it, --overwrite to start over"
                if find_checkpoint(out) is not None else "files: pass --overwrite to replace them")
        raise ValueError(f"--out {out} already holds {what}, or choose another --out (nothing was changed)")
    replaced = out.parent / f".{out.name}.replaced-{os.getpid()}"
    shutil.rmtree(replaced, ignore_errors=True)
    os.replace(out, replaced)
    print(f"--overwrite: moved the previous contents of {out} to {replaced}; they are deleted when this run "
          "succeeds", file=sys.stderr)
    out.mkdir(parents=True)
    return replaced


def publish_run_dir(out: str | Path, fill: Callable[[Path], None], replaced: Path | None = None) -> Path:
    """fill(tmp), then swap tmp in as `out` (module docstring) and delete `replaced`; returns `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes 0700 directories
    try:
        fill(tmp)
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return out
