"""The output directory of a post-training run: claimed at the start, published as one swap at the end.

    prepare_run_dir(out, base, resume, overwrite)
        refuses an --out that is, contains or lies inside the starting --checkpoint (the base model is
        never written over); with --resume, --out must hold a checkpoint of the run; otherwise --out is
        claimed with scratchlm.io_utils.claim_run_dir: refused if it holds anything unless --overwrite,
        which moves the old contents aside (deleted only once the new run succeeded).
    publish_run_dir(out, fill, replaced)
        fill(tmp) writes the finished model into a fresh sibling directory, which then replaces `out` —
        its checkpoints included — in one swap (io_utils.atomic_output_dir: renameat2 exchange on Linux),
        so a reader or a crash sees the run directory with its last checkpoint or the finished output,
        never new weights beside an old config.
While the run works, `out` holds only `out/checkpoint` (align.checkpoint), where --resume finds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from scratchlm.io_utils import atomic_output_dir, check_output_path, claim_run_dir, release_replaced
from scratchlm.train.checkpoint import find_checkpoint


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
    """Check and claim `out` for a run (module docstring); returns where old contents were moved, if anywhere."""
    out = Path(out)
    _check_not_base(out, Path(base) if base is not None else None)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it; pass only one")
    if resume:
        check_output_path(out, "dir", overwrite=True)  # a directory (or nothing) where a directory goes
        if find_checkpoint(out) is None:
            raise FileNotFoundError(f"--resume: {out} holds no checkpoint to continue (a finished run publishes "
                                    "its model and drops its checkpoints); start without --resume")
        return None
    if find_checkpoint(out) is not None and not overwrite:
        raise FileExistsError(f"--out {out} holds the checkpoint of an unfinished run; pass --resume to continue "
                              "it, --overwrite to start over, or choose another --out (nothing was changed)")
    return claim_run_dir(out, overwrite)


def publish_run_dir(out: str | Path, fill: Callable[[Path], None], replaced: Path | None = None) -> Path:
    """fill(tmp), then swap tmp in as `out` (module docstring) and delete `replaced`; returns `out`."""
    with atomic_output_dir(out, overwrite=True) as tmp:  # `out` holds only this run's checkpoints
        fill(tmp)
    release_replaced(replaced)
    return Path(out)
