"""`kerneltriage cache list | prune [--all]`: the converted-model cache (tokenizers converted from GGUF files)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `cache` and its actions to the top-level subcommands."""
    parser = subparsers.add_parser(
        "cache", help="list and prune the converted-model cache", description=__doc__ +
        " Entries are live (their model file is unchanged), stale (it changed or is gone) or unknown (no record:"
        " a load that failed, or an older kerneltriage). Downloaded models are listed by `kerneltriage models`.")
    actions = parser.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every entry, its model file, size and status")
    listing.set_defaults(func=run_list)
    prune = actions.add_parser("prune", help="remove stale and unknown entries (all with --all)")
    prune.add_argument("--all", action="store_true", help="remove every entry, live ones too")
    prune.set_defaults(func=run_prune)


def run_list(args: argparse.Namespace) -> int:
    """One row per entry; the model file's path is folded, never cut."""
    from rich.console import Console

    from kerneltriage.core.units import format_bytes
    from kerneltriage.engine.converted import converted_root, list_converted
    from kerneltriage.cli.tables import folded_table

    entries = list_converted()
    total = format_bytes(sum(e.size_bytes for e in entries))
    table = folded_table(f"converted models: {len(entries)} in {converted_root()} ({total})",
                         ("model file", "status", "size"))
    for entry in entries:
        table.add_row(entry.source or f"(no record) {entry.path.name}", entry.status, format_bytes(entry.size_bytes))
    Console().print(table)
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from kerneltriage.core.units import format_bytes
    from kerneltriage.engine.converted import converted_root, prune_converted

    removed = prune_converted(everything=args.all)
    freed = format_bytes(sum(e.size_bytes for e in removed))
    print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} from {converted_root()} ({freed})")
    return 0
