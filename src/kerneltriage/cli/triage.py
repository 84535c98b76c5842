"""`kerneltriage triage`: the three questions, answered with measurements, for one model and workload."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kerneltriage.cli.common import LEVERS_HELP, add_model_arguments
from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import DEFAULT_LEDGER_PATH

OUTPUTS = ("table", "json")

EPILOG = """examples:
  kerneltriage triage                                  the default model, pp512 + tg128 at depth 0
  kerneltriage triage --model llama3-8b --output json > triage.json
  kerneltriage triage --model hd320-1b --html report.html
  kerneltriage triage -p 2048 -n 64 -d 4096 --levers graphs --ledger ./ledger.db

Stages, in order: 0 setup (ceilings, floors, measured prefill/decode, % roofline) · 1 where time goes
(profiler shares per op class, device busy vs idle) · 2 Q1 delete work · 3 Q2 fast paths (SDPA backends,
M-sweep, casts/copies) · 4 Q3 dispatch/sync (launches, syncs with call sites, lever A/Bs) · 5 custom-kernel
outlook (Amdahl beside the 0.5–0.8× prior) · 6 ranked recommendations. Gains are end-to-end speedups of one
phase: "measured" from an interleaved A/B, "estimated" from Amdahl on measured shares, "ceiling" if the op
were free. Every finding is stored in the ledger (one experiment per run)."""


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number ≥ {minimum}, got {text!r}")
        return int(text)
    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `triage` to the top-level subcommands."""
    parser = subparsers.add_parser(
        "triage", help="the three questions, measured: delete work, unlock a fast path, cut dispatch",
        description=__doc__, epilog=EPILOG + "\n\n" + LEVERS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("-p", "--n-prompt", dest="prompt", type=_count(1), default=512, help="prompt tokens (default: 512)")
    parser.add_argument("-n", "--n-gen", dest="gen", type=_count(1), default=128, help="decode tokens (default: 128)")
    parser.add_argument("-d", "--n-depth", dest="depth", type=_count(0), default=0, help="context depth (default: 0)")
    parser.add_argument("--output", choices=OUTPUTS, default="table", help="table | json (default: table)")
    parser.add_argument("--html", type=Path, default=None, help="also write an HTML report with plots to FILE")
    parser.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER_PATH, help="ledger file (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse → load → triage (one ledger experiment) → render."""
    from kerneltriage.bench.workloads import check_fits
    from kerneltriage.cli.common import build_runner, run_config
    from kerneltriage.core.contention import contention
    from kerneltriage.core.environment import take_snapshot
    from kerneltriage.core.ledger import Ledger
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.triage.run import STAGES, triage
    from kerneltriage.triage.setup import Workload

    workload = Workload(args.prompt, args.gen, args.depth)
    speculation = run_config(args).speculation  # triage sweeps its verify shapes; the baseline does not speculate
    config = run_config(args, speculate=False)
    _check_html(args.html)
    checkpoint = load_checkpoint(args.model)
    check_fits([workload.prefill_test, workload.decode_test], checkpoint.config.max_context)
    with Ledger(args.ledger) as ledger:  # opened first: a file that is not a ledger fails before any work
        runner = build_runner(checkpoint, args, config)
        start = take_snapshot(runner.gpu_index or 0)
        with _progress(len(STAGES)) as tell:
            report = triage(get_backend(args.backend), runner, workload, tell, ledger, _label(runner, workload),
                            speculation)
        shared = contention(start, take_snapshot(runner.gpu_index or 0))
        if shared and report.experiment_id is not None:
            ledger.set_contended(report.experiment_id, shared)
    if args.html is not None:
        from kerneltriage.triage.html import write_html

        write_html(report, args.html)
    print(_json(report, shared) if args.output == "json" else render(report), end="")
    _tell_where(report, args, shared)
    return 0


def _json(report: Any, shared: str | None) -> str:
    """The report's JSON with `contention`: why the machine was shared during the run, or null."""
    return json.dumps(report.to_dict() | {"contention": shared}, indent=2, allow_nan=False) + "\n"


def _tell_where(report: Any, args: argparse.Namespace, shared: str | None) -> None:
    """On stderr (stdout may be the JSON): a shared-machine warning, the ledger entry, the report file."""
    if shared:
        print(f"warning: the machine was shared during triage ({shared}): its timings are noise-prone and its "
              "findings and ranking may not hold on a quiet machine; run it again alone", file=sys.stderr)
    if report.experiment_id is not None:
        print(f"ledger experiment #{report.experiment_id} in {args.ledger} "
              f"(kerneltriage ledger show {report.experiment_id} --ledger {args.ledger})", file=sys.stderr)
    if args.html is not None:
        print(f"HTML report: {args.html.resolve()}", file=sys.stderr)


def _check_html(path: Path | None) -> None:
    """Before any work: the folder exists and matplotlib is importable."""
    if path is None:
        return
    if not path.parent.resolve().is_dir():
        raise InputError(f"--html {path}: expected a file in an existing folder")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"--html {path}: needs matplotlib (pip install matplotlib)") from None


def _label(runner: Any, workload: Any) -> str:
    names = runner.run_config.lever_names
    levers = f" [{','.join(names)}]" if names else ""
    return f"{runner.config.name or runner.checkpoint.source}{levers}: triage pp{workload.prompt} tg{workload.gen}" + (
        f" @ d{workload.depth}" if workload.depth else "")


def render(report: Any) -> str:
    """The stages as terminal sections, then the headline lines."""
    from rich.console import Console

    from kerneltriage.triage.text import sections

    console = Console(file=sys.stdout, width=max(140, Console().width))
    with console.capture() as captured:
        for renderable in sections(report):
            console.print(renderable, highlight=False)
    return captured.get()


@contextmanager
def _progress(stages: int) -> Iterator[Any]:
    """A rich progress display on stderr naming the stage that is running."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("triage: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=stages)

        def tell(index: int, name: str) -> None:
            bar.update(task, completed=index, description=name)

        yield tell
