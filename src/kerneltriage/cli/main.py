"""`kerneltriage` entry point: a dispatch table of thin subcommands."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from kerneltriage import __version__
from kerneltriage.core.errors import InputError

# Each subcommand module exposes `register(subparsers)`, which adds its parser and sets `func`.
SUBCOMMANDS = ("generate", "models", "cache", "ledger", "bench", "ceilings", "ab", "triage", "kernel", "distill",
               "gguf")
PROG = "kerneltriage"
DEBUG_FLAG = "--debug"


class _Parser(argparse.ArgumentParser):
    """argparse, but bad flags exit 2 with one line (argparse's own usage block is noise here)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # main() prefixes "kerneltriage: error:"; name only the subcommand ("ledger list: …"), not the program again.
        command = self.prog.removeprefix(PROG).strip()
        raise InputError(f"{command}: {message}" if command else message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Before writing a GPU kernel, ask three questions and measure the answers: "
        "can I delete work? can I unlock an existing fast path? can I cut dispatch/sync overhead?",
    )
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help="show tracebacks instead of one-line errors (accepted anywhere on the line)")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        module = __import__(f"kerneltriage.cli.{name}", fromlist=["register"])
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is taken out before parsing, so it works after the subcommand too and never hides the real error.
    debug = DEBUG_FLAG in argv
    argv = [arg for arg in argv if arg != DEBUG_FLAG]
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "func", None):
            build_parser().print_help()
            return 2
        return int(args.func(args) or 0)
    except (InputError, MemoryError) as exc:
        if debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    """The message on one line; a MemoryError (empty, as numpy and Python raise it) says what it is."""
    text = " ".join(str(exc).split())
    if isinstance(exc, MemoryError):
        return f"out of memory ({text or 'MemoryError'}); {DEBUG_FLAG} shows where"
    return text
