"""Output flags of CLI commands: declared once, checked by `scratchlm.cli.main` before a command runs.

    add_output_arg(p, "--out", kind="dir", required=True, help="where the model is written")

adds the flag, records it in the parser's `outputs` default and adds `--overwrite` (once per parser).
`check_outputs(args)` (called by main for every command) applies `scratchlm.io_utils.check_output_path`
to each declared output, so a path that holds data, a file where a directory goes, a missing parent
directory that is a file... fails in one line before any work is done. The command then writes
through `atomic_output_dir` / `atomic_output_file` with `overwrite=args.overwrite` (see io_utils).
`companions` names sibling files written with a file output (a token file's `.json` sidecar).
"""

from __future__ import annotations

import argparse

from scratchlm.io_utils import OUTPUT_KINDS, check_output_path

OVERWRITE_HELP = "replace what the output path already holds (default: refuse and change nothing)"


def add_overwrite_arg(p: argparse.ArgumentParser, help: str = OVERWRITE_HELP) -> None:
    """Add --overwrite to `p` unless it has it already."""
    if "--overwrite" not in p._option_string_actions:
        p.add_argument("--overwrite", action="store_true", help=help)


def add_output_arg(p: argparse.ArgumentParser, *flags: str, kind: str, companions: tuple[str, ...] = (),
                   **kwargs) -> argparse.Action:
    """Add an output path flag of `kind` ("dir" or "file") checked before the command runs."""
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {OUTPUT_KINDS}")
    action = p.add_argument(*flags, **kwargs)
    declared = tuple(p.get_default("outputs") or ())
    p.set_defaults(outputs=declared + ((action.dest, action.option_strings[0], kind, companions),))
    add_overwrite_arg(p)
    return action


def check_outputs(args: argparse.Namespace) -> None:
    """Check every output the command declared (module docstring); raises one-line OSErrors."""
    overwrite = bool(getattr(args, "overwrite", False))
    for dest, flag, kind, companions in getattr(args, "outputs", ()) or ():
        value = getattr(args, dest, None)
        if value is None:
            continue
        check_output_path(value, kind, overwrite, flag)
        for suffix in companions:
            check_output_path(f"{value}{suffix}", "file", overwrite, flag)
