"""`kerneltriage bench`: llama-bench style prefill/decode tables, % of the device's roofline, peers side by side."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from kerneltriage.cli.common import LEVERS_HELP, add_constraint_arguments, add_model_arguments
from kerneltriage.core.ledger import default_ledger_path

OUTPUTS = ("table", "md", "csv", "json")
KERNEL_PROFILE_STEPS = 8  # decode steps profiled for the kernels-per-token figure (GPU only)
KERNEL_PROFILE_PREFIX = 16  # tokens before them

EPILOG = """examples:
  kerneltriage bench                                     pp512 and tg128 on the default model
  kerneltriage bench -p 512 -n 128 -d 0,4096 -r 5 --peers hf,hf-static
  kerneltriage bench --model llama3-8b --levers graphs --output json > result.json
  kerneltriage bench --peers llama.cpp --llama-bench ./llama-bench

Comma lists expand to their cross product like llama-bench; -p 0 or -n 0 skips that test.
pp N @ dD: prefill of N tokens after D tokens already in the cache. tg N @ dD: N decode steps after a
D-token prefill (the first token, from the prefill, is excluded: it is 'first token').
tok/s = total tokens / total time; ± = IQR of the per-sample rates; % roofline = the device's floor
(weights + KV bytes / measured copy bandwidth, or FLOPs / measured matmul peak) over the measured time;
vs kerneltriage = the row's tok/s / kerneltriage's on the same test (> 1: faster than kerneltriage).
Each engine warms up alone, then the engines' timed samples alternate (A B, B A, …): a busy machine slows
them alike. Every run is stored in the ledger (one experiment per invocation)."""


def _sizes(text: str) -> list[int]:
    """'0,4096' → [0, 4096]; anything but whole numbers ≥ 0 is refused."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected whole numbers ≥ 0 separated by commas, got {text!r}")
    return [int(p) for p in parts]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, got {text!r}")
    return int(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench` to the top-level subcommands."""
    parser = subparsers.add_parser(
        "bench", help="prefill and decode speed, %% of roofline, peers side by side", description=__doc__,
        epilog=EPILOG + "\n\n" + LEVERS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    add = parser.add_argument
    add("-p", "--n-prompt", dest="prompts", type=_sizes, default=[512], help="prefill sizes (default: 512)")
    add("-n", "--n-gen", dest="gens", type=_sizes, default=[128], help="decode sizes (default: 128)")
    add("-d", "--n-depth", dest="depths", type=_sizes, default=[0], help="context depths (default: 0)")
    add("-r", "--repetitions", dest="repeats", type=_positive, default=5, help="timed samples per test (default: 5)")
    add("--warmups", type=_count, default=1, help="untimed runs of each engine before its samples (default: 1)")
    parser.add_argument("--peers", default="", help="comma-separated: hf, hf-static, llama.cpp, mlx-lm, "
                        "torch[:LEVERS], mlx[:LEVERS] (kerneltriage on its other backend; join its levers with '+')")
    parser.add_argument("--llama-bench", type=Path, help="a llama-bench binary for the llama.cpp peer")
    parser.add_argument("--output", choices=OUTPUTS, default="table", help="table | md | csv | json (default: table)")
    parser.add_argument("--ledger", type=Path, default=default_ledger_path(), help="ledger file (default: %(default)s)")
    add_constraint_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse → load → measure (inside one ledger experiment) → render."""
    from kerneltriage.bench.workloads import check_fits, expand
    from kerneltriage.cli.common import build_runner, constrain, constraint_flags, run_config
    from kerneltriage.cli.quiet import framework_output
    from kerneltriage.core.errors import InputError
    from kerneltriage.core.ledger import Ledger
    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.peers import parse_peers

    tests = expand(args.prompts, args.gens, args.depths)
    peers = parse_peers(args.peers)
    config, constraint = run_config(args), constraint_flags(args)
    unconstrained = [peer for peer in peers if peer.split(":")[0] not in ("torch", "mlx")]
    if constraint is not None and unconstrained:  # a peer decoding free text is not the same workload
        raise InputError(f"--peers {','.join(unconstrained)}: they decode unconstrained; beside {constraint.flag} "
                         "only the torch and mlx peers (kerneltriage itself) decode the same workload")
    if args.llama_bench is not None and not args.llama_bench.is_file():
        raise InputError(f"--llama-bench {args.llama_bench}: no such file (expected a llama-bench binary)")
    checkpoint = load_checkpoint(args.model)
    constrain(checkpoint, constraint)
    check_fits(tests, checkpoint.config.max_context)
    with Ledger(args.ledger) as ledger, framework_output() as chatter:  # a non-ledger fails before any work
        runner = build_runner(checkpoint, args, config)
        report = measure(runner, tests, peers, args, ledger)
    report["notes"] = [*report["notes"], *(f"framework: {line}" for line in chatter)]  # torch's warnings, not ours
    print(render(report, args.output), end="")
    return 0


def measure(runner: Any, tests: list, peers: tuple[str, ...], args: argparse.Namespace, ledger: Any) -> dict:
    """Every test on kerneltriage and the peers, samples interleaved, recorded as one ledger experiment:
    committed whole when everything ran, not at all on an error or Ctrl-C."""
    from kerneltriage.bench.compare import run_bench
    from kerneltriage.bench.harness import Settings
    from kerneltriage.core.environment import capture_environment
    from kerneltriage.core.roofline import best_ceilings
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.peers import open_peer

    settings = Settings(args.repeats, args.warmups)
    own = get_backend(runner.backend).ceilings(runner.device, runner.dtype)
    config = _config(runner, tests, peers, settings, args, own)
    if runner.checkpoint.grammar is not None:
        config["constraint"] = runner.checkpoint.grammar.constraint.label
    environment = capture_environment()
    steps = len(tests) * (settings.warmups + settings.repeats) * (1 + len(peers))
    with _progress_bar(steps) as tell, ledger.experiment("bench", config, environment, _label(runner, tests)) as exp:
        peer_runs = [open_peer(name, runner, tests, settings, tell, args.llama_bench) for name in peers]
        theirs = [p.ceilings for p in peer_runs if p.ceilings is not None]  # kerneltriage on another backend
        ceilings = best_ceilings(own, *theirs)
        config["ceilings"] = asdict(ceilings)
        results = run_bench(runner, tests, peer_runs, settings, tell)
        for result in results:
            for m in result.measurements:
                exp.add_measurement(m)
        rows = _rows(runner, tests, results, peer_runs, ceilings)
        notes = []
        # kerneltriage's own rows above 100% are impossible (its ceilings were measured by its own framework):
        # the cached ceilings were stale or measured on a busy machine
        over = [r.test for r in rows if r.engine == "kerneltriage" and (r.roofline_pct or 0.0) > 100.0]
        if over:
            own = get_backend(runner.backend).ceilings(runner.device, runner.dtype, refresh=True)
            ceilings = best_ceilings(own, *theirs)
            config["ceilings"] = asdict(ceilings)
            rows = _rows(runner, tests, results, peer_runs, ceilings)
            notes.append(f"kerneltriage's {', '.join(over)} ran above 100% of the cached ceilings' roofline: the "
                         "ceilings were measured again (stale, or taken on a busy machine)")
        kernels = _decode_kernels(runner, tests)
        if kernels is not None:
            notes.append(f"kerneltriage decode: {kernels:.0f} kernels per token (profiled over "
                         f"{KERNEL_PROFILE_STEPS} steps after the timed runs)")
        peers_info = {p.name: {"unavailable": p.unavailable, "skipped": p.skipped, "note": p.note} for p in peer_runs}
        summary = {"rows": [r.to_dict() for r in rows], "peers": peers_info, "lever_counters": dict(runner.counters),
                   "notes": notes, "decode_kernels_per_token": kernels}
        exp.set_verdict(None, summary)
    return {**summary, "rows": rows, "config": config, "ceilings": asdict(ceilings), "experiment_id": exp.id,
            "environment": environment, "measurements": [m.to_dict() for r in results for m in r.measurements]}


def _decode_kernels(runner: Any, tests: list) -> float | None:
    """Kernels per decode token of kerneltriage's configuration, profiled after the timed runs (outside them) on a
    GPU — the floor of a graphed small model is this count × the time per kernel. None without a decode test, or
    off the GPU (there the profiler counts host ops, not kernels)."""
    if runner.device_type != "cuda" or not any(t.kind == "tg" for t in tests):
        return None
    from kerneltriage.engine.backend import get_backend

    prefix = list(range(1, KERNEL_PROFILE_PREFIX + 1))
    return get_backend(runner.backend).profile(runner, "decode", prefix, KERNEL_PROFILE_STEPS).kernels_per_token


def _config(runner: Any, tests: list, peers: tuple[str, ...], settings: Any, args: argparse.Namespace,
            ceilings: Any) -> dict:
    from kerneltriage.engine.paths import shown

    return {"model": args.model, "source": shown(runner.checkpoint.source),
            "random_weights": runner.config.random_weights, "backend": runner.backend, "device": str(runner.device),
            "dtype": runner.dtype,
            "levers": list(runner.run_config.lever_names), "spec": runner.run_config.text,
            "tests": [t.name for t in tests], "repeats": settings.repeats, "warmups": settings.warmups,
            "seed": settings.seed, "peers": list(peers), "ceilings": asdict(ceilings)}


def _label(runner: Any, tests: list) -> str:
    levers = runner.run_config.lever_names
    shown = f" [{','.join(levers)}]" if levers else ""
    return f"{runner.config.name or runner.checkpoint.source}{shown}: {', '.join(t.name for t in tests)}"


def _rows(runner: Any, tests: list, results: list, peer_runs: list, ceilings: Any) -> list:
    """Rows grouped by test (kerneltriage first, peers in the order asked), then peers that could not run."""
    from kerneltriage.bench.table import build_rows, floor_of

    traffic = _traffic(runner)
    floors = {(r.engine, r.test): floor_of(r.test, runner.config, traffic[_reads_stored(runner, r.engine, peer_runs)],
                                           ceilings)
              for r in results}
    missing = [(p.name, name, why) for p in peer_runs for name, why in p.skipped.items()]
    missing += [(p.name, "all tests", p.unavailable) for p in peer_runs if p.unavailable]
    engines = ["kerneltriage"] + [p.name for p in peer_runs]
    order = {t.name: i for i, t in enumerate(tests)}
    rows = build_rows(_model_name(runner), results, floors, missing)
    return sorted(rows, key=lambda r: (order.get(r.test, len(order)), engines.index(r.engine)))


def _reads_stored(runner: Any, engine: str, peer_runs: list) -> bool:
    """Whether an engine reads the weights at their stored precision: llama.cpp and mlx-lm do, and kerneltriage (the
    main runner or on its other backend) with MLX's `quantized` (it keeps Q4_0/Q4_1/Q8_0 blocks; any other type it
    dequantizes makes this floor a lower bound)."""
    if engine == "kerneltriage":
        return runner.run_config.has("quantized")
    peer = next((p for p in peer_runs if p.name == engine and p.ceilings is not None), None)
    if peer is not None:  # kerneltriage on its other backend
        return peer.engine.runner.run_config.has("quantized")
    return engine in ("llama.cpp", "mlx-lm")


def _traffic(runner: Any) -> tuple:
    """(engines holding dequantized weights: at the run dtype; engines reading the stored blocks: at their stored
    precision)."""
    from kerneltriage.bench.table import KV_BYTES_LLAMA_CPP, Traffic
    from kerneltriage.core.roofline import engine_weight_bytes

    size = runner.dtype_bytes
    torch_engines = Traffic(engine_weight_bytes(runner.config, size), size)
    tensors = runner.checkpoint.tensors
    # An untied embedding table is read one row per token: leave it out of the bytes per token.
    stored = sum(t.nbytes for name, t in tensors.items() if name != "embed" or runner.config.tie_embeddings)
    return torch_engines, Traffic(stored, KV_BYTES_LLAMA_CPP)


def _model_name(runner: Any) -> str:
    return runner.config.name or Path(runner.checkpoint.source).stem


def render(report: dict, output: str) -> str:
    """The rows as a terminal table, Markdown, CSV, or JSON with everything in `report`."""
    from kerneltriage.bench import table

    rows = report["rows"]
    for note in report.get("notes", ()):
        print(f"note: {note}", file=sys.stderr)
    if output == "json":
        return table.to_json(rows, {k: v for k, v in report.items() if k != "rows"})
    if output == "md":
        return table.to_markdown(rows)
    if output == "csv":
        return table.to_csv(rows)
    from rich.console import Console

    from kerneltriage.core.units import format_bandwidth, format_flops

    console = Console(file=sys.stdout, width=max(160, Console().width))
    with console.capture() as captured:
        console.print(table.to_rich(rows))
        ceilings = report["ceilings"]
        console.print(f"ceilings ({ceilings['source']}): copy {format_bandwidth(ceilings['bandwidth'])}, "
                      f"matmul {format_flops(ceilings['matmul_flops'])} ({ceilings['dtype']}) · "
                      f"ledger experiment #{report['experiment_id']}", highlight=False)
        if report["config"]["device"] == "cpu":
            console.print("peak memory on CPU: the process's peak resident set, every engine loaded", highlight=False)
    return captured.get()


@contextmanager
def _progress_bar(total: int) -> Iterator[Any]:
    """A rich progress bar on stderr; yields `tell(steps, what)`, which advances it and says what runs.
    (A peer that is not installed, or skips a test, leaves the bar short of its end: it vanishes anyway.) Where
    stderr is no terminal (a log, CI, a remote machine) the bar would print nothing: one line per change of what runs
    instead, naming the step just done, with the count and the seconds since the start, so a log cut short still
    says where it stopped."""
    import sys
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        start, done, last = time.monotonic(), [0], [""]

        def tell(steps: int, what: str) -> None:
            done[0] += steps
            if what != last[0]:
                last[0] = what
                print(f"bench: {what} done ({done[0]}/{total} steps, {time.monotonic() - start:.0f} s)",
                      file=sys.stderr, flush=True)
        yield tell
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("bench", total=total)
        yield lambda steps, what: bar.update(task, advance=steps, description=what)
