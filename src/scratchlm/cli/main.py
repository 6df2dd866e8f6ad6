"""`scratchlm` console script (also `python -m scratchlm`): builds the argparse tree and dispatches.

Each command module exposes `register(subparsers) -> None`, which adds its parser and sets
`func=<callable(args) -> int>` as the default. Add a new command by appending its module to COMMANDS.

The rules every command gets from here (docs/cli.md):
- a user error is one line on stderr, `scratchlm CMD: error: MESSAGE`, exit status 2, never a traceback:
  argparse errors, ValueError (bad values, corrupt files), KeyError, and every OSError
  (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError,
  no space left...), formatted with the path and a hint;
- outputs declared with `scratchlm.cli.outputs.add_output_arg` are checked before the command runs
  (refused if they hold anything, unless --overwrite; see `scratchlm.io_utils`);
- Ctrl-C prints `scratchlm CMD: interrupted` and exits 130;
- anything else is a bug: one line `scratchlm CMD: internal error: TYPE: MESSAGE`, exit 1
  (SCRATCHLM_TRACEBACK=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from scratchlm.cli.outputs import check_outputs

COMMANDS: tuple[str, ...] = (
    "scratchlm.cli.model_info",
    "scratchlm.cli.convert",
    "scratchlm.cli.train",
    "scratchlm.cli.quickstart",
    "scratchlm.cli.tokenizer_cmd",
    "scratchlm.cli.serve",
    "scratchlm.cli.generate",
    "scratchlm.cli.chat",
    "scratchlm.cli.viz",
    "scratchlm.cli.sft",
    "scratchlm.cli.dpo",
    "scratchlm.cli.ppo",
    "scratchlm.cli.grpo",
    "scratchlm.cli.eval",
)
USER_ERRORS = (ValueError, KeyError, OSError)
OS_HINTS = {
    FileNotFoundError: "check the path",
    NotADirectoryError: "a part of the path is a file, not a directory",
    IsADirectoryError: "it is a directory; give a file path",
    FileExistsError: "choose another path or pass --overwrite",
    PermissionError: "choose a path you may write or fix its permissions",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: `PROG: error: MESSAGE (see PROG --help)`, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} --help`)\n")


def one_line(text: str) -> str:
    """Collapse a possibly multi-line message into one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def error_message(exc: BaseException) -> str:
    """The user-facing text of a user error (module docstring)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str) and " " in exc.args[0]:
        return one_line(exc.args[0])  # a KeyError raised with a message
    if isinstance(exc, KeyError):
        return f"missing key {exc.args[0]!r}" if exc.args else "missing key"
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        hint = OS_HINTS.get(type(exc)) or ("free some disk space" if exc.errno == errno.ENOSPC else "")
        return one_line(f"{exc.filename}: {exc.strerror}" + (f"; {hint}" if hint else ""))
    return one_line(str(exc)) or type(exc).__name__


def _set_command_names(parser: argparse.ArgumentParser) -> None:
    """Store each (sub)command's parser in its defaults; the innermost one wins when parsing."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(command_parser=sub)
                _set_command_names(sub)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every registered subcommand."""
    parser = ArgumentParser(
        prog="scratchlm",
        description="scratchlm: the LLM stack from scratch (tokenizer, model, train, generate, align, serve).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    _set_command_names(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run the chosen command; user errors exit 2 with one line (module docstring)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = getattr(args, "command_parser", parser)
    if extra and not getattr(args, "accepts_overrides", False):  # only commands that opt in take --key=value
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        check_outputs(args)
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"{command.prog}: error: {error_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{command.prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless asked for the traceback
        if os.environ.get("SCRATCHLM_TRACEBACK"):
            raise
        print(f"{command.prog}: internal error: {type(exc).__name__}: {error_message(exc)} "
              "(SCRATCHLM_TRACEBACK=1 shows the traceback; please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
