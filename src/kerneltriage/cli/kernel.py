"""`kerneltriage kernel`: a custom kernel judged like everything else — checked at the model's real shapes,
timed in isolation against the stock op, then end to end through `ab` with the seam's share passed in."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kerneltriage.cli.common import add_model_arguments
from kerneltriage.core import kernel_guards
from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import default_ledger_path

ACTIONS = ("check", "run")
EPILOG = """examples:
  kerneltriage kernel check --kernel my_kernels.py:RMSNORM            correctness only, at the default model's shapes
  kerneltriage kernel run --kernel my_kernels.py:RMSNORM --model llama3-8b --levers graphs
  kerneltriage kernel run --kernel my_attention.py:DECODE --levers graphs -d 4096 -p 64 -n 128   attention at depth
  kerneltriage ledger export --format md                              the kernel ledger, among the rest

A kernel is a `kerneltriage.engine.kernels.Kernel(seam, fn, exact=False)` in FILE.py or an importable module; `fn`
gets the stock op's inputs and an output buffer to fill, fn(*inputs, out=out). Seams and their inputs:
  norm (x, weight, eps) · gate_up (x, w_gate, w_up: SiLU·mul fused) · attn.decode / attn.prefill (q, k, v, mask)
  lm_head (hidden, weight) · linear.gemv (x, weight: every projection at ≤ 16 rows)
check: fresh random inputs at the model's shapes for every row count (--rows: a decode step, a k=8 verify, a
prompt block) and cache depth (--depths), the output poisoned with NaN before every call (an element left unwritten
fails), the error against the stock op in float32 at most 1.5 × the stock op's own error (exact equality where the
kernel claims it). run: then the time per call in isolation against stock in two lanes (chained: serial, replayed
from a CUDA graph; queued: many in flight; inputs rotated beyond the L2), the seam's measured share of prefill and
decode, and `ab` of the --levers baseline against it plus kernel=REF — the one verdict rule: a kernel on a seam too
small to matter is no-lever, one never dispatched is invalid. A kernel that fails its check is never timed."""


def _rows(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}")
    return tuple(int(p) for p in parts)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `kernel` to the top-level subcommands."""
    parser = subparsers.add_parser(
        "kernel", help="a custom kernel: checked at the model's shapes, timed in isolation, judged end to end",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=ACTIONS, help="check: correctness only; run: check, time, ab, ledger")
    parser.add_argument("--kernel", required=True, help="FILE.py:NAME or pkg.module:NAME of a Kernel")
    add_model_arguments(parser)
    parser.add_argument("--rows", type=_rows, default=(1, 9, 64), help="row counts checked (default: 1,9,64)")
    parser.add_argument("--depths", type=_rows, default=(0, 512), help="cache depths checked (default: 0,512)")
    parser.add_argument("-p", "--n-prompt", dest="prompt", type=int, default=512, help="ab prefill tokens (512)")
    parser.add_argument("-n", "--n-gen", dest="gen", type=int, default=32, help="ab decode tokens (32)")
    parser.add_argument("-r", "--repetitions", dest="pairs", type=int, default=8, help="ab pairs per block (8)")
    parser.add_argument("-d", "--n-depth", dest="depth", type=int, default=0,
                        help="tokens in the cache before ab's tests, and the isolation timing's depth when set (an "
                             "attention kernel's worth shows at depth; default: 0, timed at 512)")
    parser.add_argument("--output", choices=("table", "json"), default="table", help="table | json")
    parser.add_argument("--ledger", type=Path, default=default_ledger_path(), help="ledger file (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse → load → check (and time, ab) → record → render."""
    from kerneltriage.bench import ab
    from kerneltriage.cli.common import build_runner, run_config
    from kerneltriage.core.environment import capture_environment
    from kerneltriage.core.ledger import Ledger
    from kerneltriage.engine.backend import get_backend
    from kerneltriage.engine.kernels import load_kernel
    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.triage import kernel_path

    config = run_config(args)
    backend = get_backend(args.backend)  # the backend's clocks are sealed before the candidate's code first runs
    kernel = load_kernel(args.kernel)  # a bad reference is one line before any loading
    try:
        settings = kernel_path.KernelSettings(args.rows, args.depths, time_depth=args.depth or kernel_path.TIME_DEPTH,
                                              ab=ab.Settings(args.prompt, args.gen, args.pairs, depth=args.depth))
    except ValueError as exc:
        raise InputError(f"kernel: {exc}") from None
    checkpoint = load_checkpoint(args.model)
    with Ledger(args.ledger) as ledger:
        runner = build_runner(checkpoint, args, config)
        if args.action == "check":
            report = kernel_path.check_kernel(backend, runner, args.kernel, settings)
        else:
            report = kernel_path.run_kernel(backend, runner, args.kernel, settings,
                                            lambda what: print(f"kernel: {what}", file=sys.stderr))
        meta = {"kernel": args.kernel, "seam": kernel.seam, "model": checkpoint.source, "action": args.action,
                "levers": config.text, "device": str(runner.device), "dtype": runner.dtype}
        experiment = kernel_path.record(report, ledger, meta, capture_environment())
    print(render(report, args.output, experiment), end="")
    return 0


def render(report: Any, output: str, experiment: int) -> str:
    """The checks, the isolation timings, labels and the verdict as text, or everything as JSON."""
    if output == "json":
        return json.dumps({"experiment_id": experiment, **report.summary()}, indent=2, default=str) + "\n"
    lines = [f"kernel {report.kernel} at seam {report.seam}"]
    lines += [_check_line(c) for c in report.checks]
    lines += [_timing_line(t) for t in report.timings]
    if report.shares:
        lines.append("  seam share: " + ", ".join(f"{p} {s:.1%}" for p, s in report.shares.items()))
    if report.ab is not None:
        lines += [f"  end to end {p.test.phase}: B/A {p.ratio.estimate:.3f} [{p.ratio.low:.3f}, {p.ratio.high:.3f}]"
                  f" (band ±{p.band:.3f}) {p.verdict.verdict}" for p in report.ab.phases]
    lines += [f"  label {label}" for label in report.labels]
    if report.verdict is None:
        lines.append(f"check: {'passed' if report.passed else 'FAILED'} at {len(report.checks)} shapes (not timed)")
    else:
        lines.append(f"verdict: {report.verdict.verdict.upper()} — {report.verdict.reason}")
    lines.append(f"ledger experiment #{experiment}")
    return "\n".join(lines) + "\n"


def _check_line(c: Any) -> str:
    return (f"  check {c.rows:>4} rows depth {c.depth:>5} {c.shape}: error {c.error:.1e} (stock {c.stock_error:.1e}, "
            f"bound {c.tolerance:.1e}), unwritten {c.unwritten}" + ("" if c.exact is None else f", exact {c.exact}")
            + (f" [{c.trial}]" if c.trial == "unseen-shape" else "") + ("" if c.passed else "  FAIL"))


def _timing_line(t: Any) -> str:
    spread = ""
    if t.kernel_samples:
        low, high = kernel_guards.spread(t.kernel_samples)
        spread = f" [IQR {low * 1e6:.2f}–{high * 1e6:.2f}]"
    return (f"  isolation {t.lane:8s} {t.kernel_seconds * 1e6:9.2f} µs{spread} vs stock "
            f"{t.stock_seconds * 1e6:9.2f} µs = {t.ratio:.2f}× ("
            + (f"median of {len(t.kernel_samples)} samples, " if t.kernel_samples else "") + f"{t.timer})")
