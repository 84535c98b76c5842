"""`kerneltriage` entry point: a dispatch table of thin subcommands."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from kerneltriage.core.errors import InputError

# Each subcommand module exposes `register(subparsers)`, which adds its parser and sets `func`.
SUBCOMMANDS = ("generate", "models", "ledger", "bench", "ceilings", "ab", "triage", "kernel")


class _Parser(argparse.ArgumentParser):
    """argparse, but bad flags exit 2 with one line (argparse's own usage block is noise here)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kerneltriage",
        description="Before writing a GPU kernel, ask three questions and measure the answers: "
        "can I delete work? can I unlock an existing fast path? can I cut dispatch/sync overhead?",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        module = __import__(f"kerneltriage.cli.{name}", fromlist=["register"])
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "func", None):
            build_parser().print_help()
            return 2
        return int(args.func(args) or 0)
    except InputError as exc:
        if debug:
            raise
        print(f"kerneltriage: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kerneltriage: interrupted", file=sys.stderr)
        return 130
