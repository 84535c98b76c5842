"""`kerneltriage ab`: an honest A/B of two configurations — outputs checked, candidate proven to run, A/A
noise band, paired interleaved prefill and decode, optional sustained window, checklist and verdict."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from kerneltriage.core.ledger import default_ledger_path
from kerneltriage.core.units import format_sig

OUTPUTS = ("table", "json", "md")
STATUS_MARKS = {"ok": "✓", "warn": "!", "unknown": "?"}
COLUMNS = ("phase", "test", "A tok/s ± IQR", "B tok/s ± IQR", "B/A [CI] (its level)", "A/A band", "verdict")

EPILOG = """examples:
  kerneltriage ab --b levers=last_logits                    stock vs last_logits on the default model
  kerneltriage ab --model llama3-8b --a 'levers=' --b 'levers=graphs,one_sync' -r 10 --sustain 60
  kerneltriage ab --b levers=graphs --output json > ab.json
  kerneltriage ab --a levers=graphs --b 'levers=graphs;spec=selfdraft:15;depth=4'   speculation under graphs

A side is key=value pairs separated by ';': levers=a,b ('levers=' is stock), spec=ngram[:N]|suffix[:N]|selfdraft[:L]|
draft:MODEL|eagle[:PATH] and depth=K|auto (speculative decoding, as --spec and --spec-depth on generate). The timed
prompts are random tokens: prompt lookup (ngram, suffix) finds nothing to draft there, and a B whose speculation
never verified is invalid;
--prompts FILE.jsonl decodes after each of a file's prompts instead (benchmarks/prompts/ has sets).
Order of work: greedy digests of A and B must match (levers that reorder the arithmetic may instead stay
within a stated logit tolerance: in bf16 the lever in float32 within 1e-4 of float32 stock, and no further
from float32 than 1.5 × A's own rounding error), per-op checks at the model's shapes, then A against a second
copy of A (A/A) sizes the noise band; then -r pairs of A and B, interleaved, prefill (pp N) and decode (tg N)
apart; the timed runs' own tokens are compared last. tok/s = tokens / median sample time; ± = IQR of the
per-sample rates; B/A = the median of the per-pair ratios A time / B time with its order-statistic CI, whose
printed level is the one it has at this many pairs (5 pairs: 94%); the A/A band is 1 ± the A/A CI bound
farthest from 1 (at least 1%). Verdicts: win / loss (B/A CI clear of the band),
traded (a win in one phase, another phase's estimate below the band), neutral, no-lever, indicative (fewer than
5 pairs: never a win), contended (the A/A band wider than ±0.5: no verdict), invalid (outputs differ, or a
lever of B never ran in the timed runs).
Exit status is 0 whatever the verdict. Every run is one ledger experiment with all its samples."""


def _whole(minimum: int) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number ≥ {minimum}, got {text!r}")
        return int(text)
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds ≥ 0, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ab` to the top-level subcommands."""
    from kerneltriage.cli.common import LEVERS_HELP, add_constraint_arguments, add_engine_arguments

    parser = subparsers.add_parser(
        "ab", help="honest A/B of two configurations: A/A noise, paired runs, checklist, verdict",
        description=__doc__, epilog=EPILOG + "\n\n" + LEVERS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_arguments(parser)
    add = parser.add_argument
    add("--a", default="levers=", help="baseline configuration (default: 'levers=': stock)")
    add("--b", required=True, help="candidate configuration, e.g. 'levers=graphs,one_sync'")
    add("-p", "--n-prompt", dest="prompt", type=_whole(0), default=512, help="prefill tokens (default: 512; 0 skips)")
    add("-n", "--n-gen", dest="gen", type=_whole(0), default=128, help="decode tokens (default: 128; 0 skips)")
    add("-d", "--n-depth", dest="depth", type=_whole(0), default=0,
        help="tokens in the cache before each test, as llama-bench's -d (default: 0)")
    add("-r", "--repetitions", dest="pairs", type=_whole(2), default=10, help="pairs per block (default: 10)")
    add("--warmups", type=_whole(0), default=1, help="untimed samples per config and phase (default: 1)")
    add("--sustain", type=_seconds, default=0.0, help="seconds of sustained alternation (default: 0 = none)")
    add("--prompts", type=Path, default=None, help="decode on the prompts of this JSON-lines file ({\"prompt\": ...} "
        "per line, in the chat template) instead of random tokens: how speculation is judged")
    add("--no-chat", dest="chat", action="store_false", help="with --prompts: the prompts as written, no chat template")
    add("--output", choices=OUTPUTS, default="table", help="table | json | md (default: table)")
    add("--ledger", type=Path, default=default_ledger_path(), help="ledger file (default: %(default)s)")
    add_constraint_arguments(parser)  # both sides decode under it: a constrained workload
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse → load → check, measure, judge → record → render."""
    from kerneltriage.bench.ab import Settings, build_runners, run_ab
    from kerneltriage.bench.ab_report import record
    from kerneltriage.bench.workloads import check_fits, load_prompt_set
    from kerneltriage.cli.common import check_before_loading, constrain, constraint_flags
    from kerneltriage.core.environment import capture_environment
    from kerneltriage.core.errors import InputError
    from kerneltriage.core.ledger import Ledger
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.configuration import RunConfig
    from kerneltriage.engine.sources import load_checkpoint

    a, b = RunConfig.parse(args.a, "--a"), RunConfig.parse(args.b, "--b")
    check_before_loading(args, a, b)
    constraint = constraint_flags(args)
    if args.prompts is not None and args.depth:
        raise InputError("-d with --prompts: the prompts are the context; give one or the other")
    if args.prompts is not None and not args.prompts.is_file():
        raise InputError(f"--prompts {args.prompts}: no such file (expected JSON lines of {{\"prompt\": ...}})")
    backend = get_backend(args.backend)
    checkpoint = load_checkpoint(args.model)
    constrain(checkpoint, constraint)
    prompt_set = load_prompt_set(args.prompts, checkpoint.tokenizer, args.chat) if args.prompts else None
    settings = Settings(args.prompt, args.gen, args.pairs, args.warmups, args.sustain, prompt_set, depth=args.depth)
    check_fits(settings.tests, checkpoint.config.max_context)
    device = backend.resolve_device(args.device)
    dtype = backend.resolve_dtype(args.dtype, device)
    with Ledger(args.ledger) as ledger:  # opened first: a file that is not a ledger fails before any work
        runners = build_runners(backend, checkpoint, a, b, device, dtype)
        print(f"loaded {checkpoint.source} three times (A, A', B) on {device} ({dtype})", file=sys.stderr)
        environment = capture_environment()
        with _spinner() as progress:
            report = run_ab(backend, runners, settings, progress)
        if constraint is not None:  # the workload's, recorded beside the two configurations
            report.config["constraint"] = constraint.label
        experiment_id = record(report, ledger, environment)
    result = {"experiment_id": experiment_id, "config": report.config, **report.summary(),
              "environment": environment, "measurements": [m.to_dict() for m in report.measurements]}
    print(render(result, args.output), end="")
    return 0


def _cells(phase: dict) -> list[str]:
    r, band = phase["ratio"], phase["band"]
    return [phase["phase"], phase["test"],
            f"{format_sig(phase['a']['tok_s'])} ± {format_sig(phase['a']['iqr'], 2)}",
            f"{format_sig(phase['b']['tok_s'])} ± {format_sig(phase['b']['iqr'], 2)}",
            f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}] ({r['confidence']:.0%})",
            f"1 ± {band:.3f}", phase["verdict"]]


def _phase_line(phase: dict) -> str:
    warned = f" (warnings: {', '.join(phase['warnings'])})" if phase["warnings"] else ""
    return f"phase {phase['phase']}: {phase['reason']}{warned}"


def _spec_line(side: str, stats: dict) -> str:
    """One side's draft source over the timed runs: tokens per verify step, acceptance by position, shadows."""
    percent = lambda rates: " ".join(f"{rate:.0%}" for rate in rates) or "-"  # noqa: E731
    shadow = (f"; shadow drafts {stats['shadow_drafts']} (by position "
              f"{percent(stats['shadow_acceptance_by_position'])})" if stats["shadow_drafts"] else "")
    return (f"spec {side} {stats['source']}: {stats['verify_steps']} verify + {stats['plain_steps']} plain steps, "
            f"{stats['tokens_per_verify_step']:.2f} tok/verify step, acceptance by position "
            f"{percent(stats['acceptance_by_position'])}{shadow}")


def _lines(result: dict) -> list[str]:
    """Everything below the table: overall verdict, outputs, executions, sustained window, checklist."""
    config = result["config"]
    executed = "; ".join(f"{name}: " + ", ".join(f"{lever} ×{n}" for lever, n in c.items())
                         for name, c in result["counters"].items() if c) or "no levers on either side"
    lines = [f"A: {config['a']['label']}   B: {config['b']['label']}   "
             f"({config['model']}, {config['device']}, {config['dtype']}, {config['pairs']} pairs per block)",
             f"verdict: {result['verdict'].upper()} — {result['reason']}",
             f"outputs: {'ok' if result['correctness']['passed'] else 'DIFFER'} — {result['correctness']['detail']}",
             f"executed in the timed runs: {executed}"]
    lines += [_phase_line(p) for p in result["phases"]]
    lines += [_spec_line(side, stats) for side, stats in result.get("speculation", {}).items()]
    lines += [f"sustained {label}: {w['first_tok_s']:,.1f} → {w['last_tok_s']:,.1f} tok/s "
              f"({w['last_tok_s'] / w['first_tok_s'] - 1:+.1%}) first → last window"
              for label, w in result["sustained"].items()]
    lines += [f"{STATUS_MARKS[item['status']]} {item['point']}: {item['answer']}" for item in result["checklist"]]
    return lines + [f"ledger experiment #{result['experiment_id']}"]


def render(result: dict, output: str) -> str:
    """The A/B as a terminal table, Markdown, or JSON with everything (raw samples included)."""
    if output == "json":
        return json.dumps(result, indent=2, allow_nan=False) + "\n"
    rows = [_cells(p) for p in result["phases"]]
    if output == "md":
        table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        table += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(table + [""] + [f"- {line}" for line in _lines(result)]) + "\n"
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=sys.stdout, width=max(140, Console().width))
    grid = Table(*COLUMNS)
    for row in rows:
        grid.add_row(*map(escape, row))
    with console.capture() as captured:
        console.print(grid)
        for line in _lines(result):
            console.print(line, markup=False, highlight=False)
    return captured.get()


@contextmanager
def _spinner() -> Iterator[Any]:
    """A rich spinner on stderr; the yielded `progress(what)` says what is running now."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("ab: {task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("loading", total=None)
        yield lambda what: bar.update(task, description=what)
