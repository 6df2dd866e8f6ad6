"""`scratchlm` console script: builds the argparse tree from the command modules and dispatches.

Each command module exposes `register(subparsers) -> None`, which adds its parser and sets
`func=<callable(args) -> int>` as the default. Add a new command by appending its module to COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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
)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="scratchlm",
        description="scratchlm: the LLM stack from scratch (tokenizer, model, train, generate, align, serve).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run the chosen command; errors from bad input exit 2 with a one-line message."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):  # only commands that opt in take --key=value
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"scratchlm {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
