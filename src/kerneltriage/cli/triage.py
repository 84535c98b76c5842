"""`kerneltriage triage`: the three questions, answered with measurements, for one model and workload."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kerneltriage.cli.common import LEVERS_HELP, add_constraint_arguments, add_model_arguments
from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import default_ledger_path

OUTPUTS = ("table", "json")
PEER_REPEATS = 3  # timed samples per test of the final configuration beside each peer
BUDGETS = ("quick", "full")  # triage/candidates.py's (not imported here: --help loads no framework)
FAVORS = ("balanced", "decode", "prefill")  # triage/climb.py's

EPILOG = """examples:
  kerneltriage triage                                  the default model, pp512 + tg128 at depth 0
  kerneltriage triage --model llama3-8b --output json > triage.json
  kerneltriage triage --prompts benchmarks/prompts/copy_heavy.jsonl     speculation becomes a candidate
  kerneltriage triage --favor decode --budget full     compile and other slow-to-warm levers tried too
  kerneltriage triage --peers llama.cpp --llama-bench ./llama-bench     the final set beside llama.cpp

Stages, in order: 0 setup (ceilings, floors, measured prefill/decode, % roofline) · 1 where time goes
(profiler shares per op class, device busy vs idle) · 2 Q1 delete work · 3 Q2 fast paths (SDPA backends,
M-sweep, casts/copies) · 4 Q3 dispatch/sync (launches, syncs with call sites) · 5 the climb: every lever that
applies here (and, with --prompts, speculation) judged by `ab` against the configuration reached so far, winners
adopted one rung at a time, until nothing wins or the budget is spent; the final set confirmed against the start
· 6 custom-kernel outlook on the final set (Amdahl beside the 0.5–0.8× prior) · 7 the ladder's rungs and the
flags to paste. Gains are end-to-end speedups of one phase: "measured" from an interleaved A/B, "estimated"
from Amdahl on measured shares, "ceiling" if the op were free. Every finding is stored in the ledger (one
experiment per run); --html writes the report with plots (the ladder among them)."""


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
    parser.add_argument("-p", "--n-prompt", dest="prompt", type=_count(1), default=512,
                        help="prompt tokens (default: 512)")
    parser.add_argument("-n", "--n-gen", dest="gen", type=_count(1), default=128, help="decode tokens (default: 128)")
    parser.add_argument("-d", "--n-depth", dest="depth", type=_count(0), default=0, help="context depth (default: 0)")
    parser.add_argument("--output", choices=OUTPUTS, default="table", help="table | json (default: table)")
    parser.add_argument("--html", type=Path, default=None, help="also write an HTML report with plots to FILE")
    parser.add_argument("--budget", choices=BUDGETS, default="quick",
                        help="quick: levers whose warm-up is slow (compile) are left out, the climb stops near its "
                             "time target; full: every lever, a longer climb (default: quick)")
    parser.add_argument("--favor", choices=FAVORS, default="balanced",
                        help="which phase a traded lever (faster in one, slower in the other) is adopted for; "
                             "balanced weighs the workload's own time in each (default: balanced)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSON lines of {\"prompt\": ...}: every decode sample runs over them, and speculation "
                             "(suffix, ngram) becomes a candidate")
    parser.add_argument("--no-chat", dest="chat", action="store_false",
                        help="with --prompts: the prompts as written, no chat template")
    parser.add_argument("--peers", default="", help="stand the final configuration beside these (as bench --peers)")
    parser.add_argument("--llama-bench", type=Path, default=None, help="a llama-bench binary for the llama.cpp peer")
    parser.add_argument("--ledger", type=Path, default=default_ledger_path(), help="ledger file (default: %(default)s)")
    add_constraint_arguments(parser)  # a constrained workload: every configuration decodes under it
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse → load → triage (one ledger experiment) → render."""
    from kerneltriage.bench.workloads import check_fits
    from kerneltriage.cli.common import build_runner, constrain, constraint_flags, run_config
    from kerneltriage.cli.quiet import framework_output
    from kerneltriage.core.contention import contention
    from kerneltriage.core.environment import take_snapshot
    from kerneltriage.core.ledger import Ledger
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.triage.run import STAGES, triage
    from kerneltriage.triage.setup import Workload

    began = time.perf_counter()  # after the framework's import: "start" below is the load of the model
    workload = Workload(args.prompt, args.gen, args.depth)
    config, constraint = run_config(args), constraint_flags(args)
    _check_files(args)
    if constraint is not None and args.peers:
        raise InputError(f"--peers {args.peers}: peers decode unconstrained, not the {constraint.flag} workload")
    checkpoint = load_checkpoint(args.model)
    constrain(checkpoint, constraint)
    check_fits([workload.prefill_test, workload.decode_test], checkpoint.config.max_context)
    with Ledger(args.ledger) as ledger, framework_output() as chatter:  # a non-ledger fails before any work
        runner = build_runner(checkpoint, args, config)
        backend = get_backend(runner.backend)
        options = _options(args, checkpoint, backend, runner, workload, ledger)
        loaded = time.perf_counter() - began
        start = take_snapshot(runner.gpu_index or 0)
        with _progress(len(STAGES)) as tell:
            report = triage(backend, runner, workload, tell, ledger, _label(runner, workload), options)
        shared = contention(start, take_snapshot(runner.gpu_index or 0))
        if shared and report.experiment_id is not None:
            ledger.set_contended(report.experiment_id, shared)
    report.notes += [f"framework: {line}" for line in chatter]
    report.stage_seconds = {"load": loaded} | report.stage_seconds  # the model read and built on the device
    if args.html is not None:
        from kerneltriage.triage.html import write_html

        write_html(report, args.html)
    print(_json(report, shared) if args.output == "json" else render(report, shared), end="")
    _tell_where(report, args, shared)
    return 0


def _options(args: argparse.Namespace, checkpoint: Any, backend: Any, runner: Any, workload: Any, ledger: Any
             ) -> Any:
    """The climb's options from the flags: budget, favour, the prompts, the ledger's winning kernels, the peer."""
    from kerneltriage.bench.workloads import load_prompt_set
    from kerneltriage.triage.candidates import winning_kernels
    from kerneltriage.triage.run import Options

    prompts = load_prompt_set(args.prompts, checkpoint.tokenizer, args.chat) if args.prompts else None
    if prompts is not None and prompts.longest + workload.gen + 1 > checkpoint.config.max_context:
        raise InputError(f"--prompts {args.prompts}: the longest prompt ({prompts.longest} tokens) and -n "
                         f"{workload.gen} new ones exceed the model's context of {checkpoint.config.max_context}")
    kernels = tuple(winning_kernels(ledger, runner.config.name or checkpoint.source))
    peer = _peer(args, backend, runner, workload) if args.peers else None
    return Options(args.budget, args.favor, prompts, kernels=kernels, peer=peer)


def _peer(args: argparse.Namespace, backend: Any, runner: Any, workload: Any) -> Any:
    """A function that benches a configuration beside the peers on the workload's two tests (bench's harness)."""
    from kerneltriage.bench.compare import run_bench
    from kerneltriage.bench.harness import ENGINE, Settings
    from kerneltriage.peers import open_peer, parse_peers

    names = parse_peers(args.peers)
    tests = [workload.prefill_test, workload.decode_test]

    def beside(final: Any) -> dict[str, Any]:
        ours = backend.copy(runner, final)
        try:
            settings = Settings(PEER_REPEATS)
            runs = [open_peer(name, ours, tests, settings, None, args.llama_bench) for name in names]
            results = run_bench(ours, tests, runs, settings)
        finally:
            backend.release(ours)
        rate = {(r.engine, r.test.name): r.timed.rate for r in results}
        rows = [{"peer": engine, "test": test, "ours": rate[(ENGINE, test)], "theirs": value,
                 "ratio": rate[(ENGINE, test)] / value} for (engine, test), value in rate.items()
                if engine != ENGINE and (ENGINE, test) in rate]
        unavailable = {run.name: run.unavailable for run in runs if run.unavailable}
        return {"peer": ", ".join(names), "config": final.text, "rows": rows, "unavailable": unavailable}

    return beside


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


def _check_files(args: argparse.Namespace) -> None:
    """Before any loading: the report's folder, the prompts file, the llama-bench binary and the peers' names."""
    from kerneltriage.peers import parse_peers

    _check_html(args.html)
    if args.prompts is not None and not args.prompts.is_file():
        raise InputError(f"--prompts {args.prompts}: no such file (expected JSON lines of {{\"prompt\": ...}})")
    if args.llama_bench is not None and not args.llama_bench.is_file():
        raise InputError(f"--llama-bench {args.llama_bench}: no such file (expected a llama-bench binary)")
    parse_peers(args.peers)


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


def render(report: Any, shared: str | None = None) -> str:
    """The stages as terminal sections, then the headline lines; on a shared machine a warning before the headline
    rates, which then do not describe a quiet machine."""
    from rich.console import Console

    from kerneltriage.triage.text import sections

    console = Console(file=sys.stdout, width=max(140, Console().width))
    with console.capture() as captured:
        for renderable in sections(report, shared):
            console.print(renderable, highlight=False)
    return captured.get()


@contextmanager
def _progress(stages: int) -> Iterator[Any]:
    """A rich progress display on stderr naming the stage that is running; where stderr is no terminal (a log, a
    CI job), one line per step with the seconds since triage began, so a log says where the time went."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not sys.stderr.isatty():
        began, last = time.perf_counter(), [""]

        def line(index: int, name: str) -> None:
            if name != last[0] and " pair " not in name:  # a block's pairs: the bar's business, not the log's
                print(f"triage [{time.perf_counter() - began:6.1f} s] {index + 1}/{stages} {name}", file=sys.stderr,
                      flush=True)
                last[0] = name

        yield line
        return

    columns = (TextColumn("triage: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=stages)

        def tell(index: int, name: str) -> None:
            bar.update(task, completed=index, description=name)

        yield tell
