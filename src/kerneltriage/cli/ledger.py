"""`kerneltriage ledger list | show ID | export`: every experiment ever measured."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kerneltriage.cli.tables import add_row, folded_table

from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import ExperimentRecord, ExperimentRow, Ledger, default_ledger_path
from kerneltriage.core.ledger_export import FORMATS, MD_COLUMNS, measurement_cells

DEFAULT_LIST_LIMIT = 20


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return int(text)


def _action(actions: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help_text, description=help_text)
    parser.add_argument(
        "--ledger", type=Path, default=default_ledger_path(), help="ledger file (default: %(default)s)"
    )
    parser.set_defaults(func=run, ledger_action=name)
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ledger` and its actions to the top-level subcommands."""
    parser = subparsers.add_parser(
        "ledger", help="list, show and export recorded experiments", description=__doc__
    )
    actions = parser.add_subparsers(dest="ledger_action", metavar="ACTION", required=True)
    listing = _action(actions, "list", "the newest experiments, newest first")
    listing.add_argument("--limit", type=_positive_int, default=DEFAULT_LIST_LIMIT, help="how many to show")
    show = _action(actions, "show", "one experiment: config, environment, measurements, findings")
    show.add_argument("id", type=int, help="experiment id (from `ledger list`)")
    export = _action(actions, "export", "every experiment as Markdown, CSV or JSON")
    export.add_argument("--format", choices=FORMATS, default="md", help="output format (default: %(default)s)")
    export.add_argument("--output", type=Path, help="write to this file instead of standard output")


def run(args: argparse.Namespace) -> int:
    """Open the ledger (it must exist) and run the chosen action. The default ledger not made yet lists as empty:
    nothing recorded is not an error (a --ledger path that is not there is: a typo)."""
    if args.ledger_action == "list" and args.ledger == default_ledger_path() and not args.ledger.exists():
        print(f"ledger {args.ledger}: no experiments recorded yet (triage, ab, bench and kernel record there)")
        return 0
    with Ledger(args.ledger, create=False) as ledger:
        _ACTIONS[args.ledger_action](ledger, args)
    return 0


def _list(ledger: Ledger, args: argparse.Namespace) -> None:
    rows = ledger.list_experiments(args.limit)
    if not rows:
        print(f"ledger {ledger.path}: no experiments recorded")
        return
    Console().print(render_list(rows))


def _show(ledger: Ledger, args: argparse.Namespace) -> None:
    record = ledger.get_experiment(args.id)
    console = Console()
    for renderable in render_experiment(record):
        console.print(renderable)


def _export(ledger: Ledger, args: argparse.Namespace) -> None:
    text = ledger.export(args.format)
    if args.output is None:
        sys.stdout.write(text)
        return
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--output {args.output}: cannot write ({exc.strerror})") from exc


_ACTIONS: dict[str, Callable[[Ledger, argparse.Namespace], None]] = {
    "list": _list,
    "show": _show,
    "export": _export,
}


def render_list(rows: list[ExperimentRow]) -> Table:
    """The `ledger list` table: fits 80 columns, folds a long label, marks a run on a shared machine."""
    table = folded_table(None, ("id", "created (UTC)", "kind", "label", "verdict", "meas/find", "shared"), whole=(0,))
    for r in rows:
        created = r.created[:16].replace("T", " ")  # ISO 8601 UTC, to the minute
        add_row(table, r.id, created, r.kind, r.label, r.verdict, f"{r.measurements}/{r.findings}",
             "yes" if r.contended else "")
    return table


def _environment_line(env: Mapping[str, Any]) -> str:
    git, packages = env.get("git") or {}, env.get("packages") or {}
    devices = (env.get("gpu") or {}).get("devices", [])
    parts = {
        "code": git.get("sha") and git["sha"][:10] + (" (dirty)" if git.get("dirty") else ""),
        "python": env.get("python"),
        "torch": packages.get("torch"),
        "mlx": packages.get("mlx"),
        "GPU": ", ".join(str(d.get("name")) for d in devices),
        "CPU": (env.get("cpu") or {}).get("model"),
    }
    line = " · ".join(f"{key} {value}" for key, value in parts.items() if value)
    return line or "environment not recorded"


def render_experiment(record: ExperimentRecord) -> list[Any]:
    """The `ledger show` output: a header, a measurement table and a findings table."""
    label = f" — {record.label}" if record.label else ""
    header = Text(
        f"experiment #{record.id} {record.kind}{label}\n"
        f"created {record.created} · verdict {record.verdict or '—'}\n"
        f"{'shared machine: ' + record.contended + chr(10) if record.contended else ''}"
        f"config {json.dumps(record.config, sort_keys=True)}\n"
        f"summary {json.dumps(record.summary, sort_keys=True)}\n"
        f"{_environment_line(record.environment)}"
    )
    measurements = folded_table("measurements", MD_COLUMNS)
    for m in record.measurements:
        add_row(measurements, *measurement_cells(m))
    findings = folded_table("findings", ("question", "code", "title"))
    for f in record.findings:
        add_row(findings, f.question, f.code, f.title)
    return [header, measurements, findings]
