"""The custom-kernel path: a kernel at a seam of the model is checked in isolation at the model's real shapes,
timed in isolation against the stock op, then judged end to end by `ab` as the lever `kernel=REF` — with the seam's
measured share of each phase passed in, so a kernel that cannot matter is `no-lever`, not a win. A kernel that
fails its check is never timed: the verdict is `invalid`; one a timing guard catches is never judged end to end.

Every guard that fires is named in the verdict's reason (docs/kernels.md, "Planted cheats": how each documented
cheat works and which guard catches it): the check's (kernel_check on torch), the timing's (kernel_time), the judge's
seal over its clocks and numeric flags (core/integrity: checked after the candidate's import, its check, its timing
and its A/B) and the roofline (core/kernel_guards: a call faster than its bytes and FLOPs allow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from kerneltriage.bench import ab
from kerneltriage.bench.harness import Settings as BenchSettings
from kerneltriage.bench.harness import run_test
from kerneltriage.bench.workloads import Test
from kerneltriage.core import integrity, kernel_guards
from kerneltriage.core.verdict import Verdict
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.kernels import load_kernel
from kerneltriage.engine.levers import LEVERS, LeverSetting
from kerneltriage.engine.probes import KernelCheck, KernelTiming
from kerneltriage.triage.breakdown import from_profile
from kerneltriage.triage.shares import seam_shares

DECODE_ROWS, VERIFY_ROWS, PREFILL_ROWS = 1, 9, 64  # a decode step, a k = 8 verify, a block of prompt rows
SHARE_STEPS = 8  # decode steps profiled for the seam's share
TIME_DEPTH = 512  # cache depth of the isolation timing unless the A/B's depth is given
WARM_LANES = ("chained", "queued")  # the lanes whose ratio bounds what the kernel can give (not the cold lane)


@dataclass(frozen=True)
class KernelSettings:
    """Where the kernel is checked (row counts, cache depths) and timed, and the end-to-end A/B's workload."""

    rows: tuple[int, ...] = (DECODE_ROWS, VERIFY_ROWS, PREFILL_ROWS)
    depths: tuple[int, ...] = (0, 512)
    time_rows: int = DECODE_ROWS
    time_depth: int = TIME_DEPTH
    ab: ab.Settings = field(default_factory=lambda: ab.Settings(prompt=512, gen=32, pairs=8))

    def __post_init__(self) -> None:
        if not self.rows or min(self.rows) < 1 or min(self.depths, default=0) < 0:
            raise ValueError(f"kernel settings: rows ≥ 1 and depths ≥ 0, got {self.rows}, {self.depths}")


@dataclass
class KernelReport:
    """What the path found: the checks, the isolation timings, the seam's shares, the A/B and the verdict."""

    kernel: str
    seam: str
    checks: list[KernelCheck]
    timings: list[KernelTiming] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)
    ab: ab.Report | None = None
    verdict: Verdict | None = None
    caught: list[str] = field(default_factory=list)  # guards outside the check's rows: seal, timing, roofline

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and not self.caught

    @property
    def labels(self) -> list[str]:
        """What was found that fails nothing: stock-call, bimodal."""
        found = [label for c in self.checks for label in c.labels] + [label for t in self.timings for label in t.labels]
        return list(dict.fromkeys(found))

    @property
    def failures(self) -> list[str]:
        """Every guard's finding, each "guard: what it saw": the seal's, the timing's, then each failed shape's."""
        return self.caught + [f for c in self.checks for f in _failures(c)]

    @property
    def guards(self) -> list[str]:
        """The name of every guard that fired."""
        return list(dict.fromkeys(f.split(":")[0] for f in self.failures))

    def row(self) -> dict[str, Any]:
        """The kernel ledger's row: kernel, seam, correctness, isolation ratio per lane, end-to-end ratios, verdict."""
        phases = {p.test.phase: p.ratio.estimate for p in self.ab.phases} if self.ab else {}
        failed = [c for c in self.checks if not c.passed]
        return {"kernel": self.kernel, "seam": self.seam,
                "correctness": "ok" if not failed else f"FAIL at {len(failed)} of {len(self.checks)} shapes",
                "guards": self.guards, "labels": self.labels,
                "worst_error": max((c.error for c in self.checks), default=None),
                "isolation": {t.lane: t.ratio for t in self.timings},
                "prefill": phases.get("prefill"), "decode": phases.get("decode"),
                "shares": self.shares, "verdict": self.verdict.verdict if self.verdict else None,
                "reason": self.verdict.reason if self.verdict else "checked only: not timed"}

    def summary(self) -> dict[str, Any]:
        return {**self.row(), "checks": [c.to_dict() for c in self.checks],
                "timings": [t.to_dict() for t in self.timings], "ab": self.ab.summary() if self.ab else None}


def check_kernel(backend: Backend, runner: Runner, ref: str, settings: KernelSettings) -> KernelReport:
    """Correctness only: every row count and depth and shapes drawn at random, fresh inputs, poisoned outputs, and
    the judge's seal after the candidate's import and after its calls."""
    kernel = load_kernel(ref)
    report = KernelReport(ref, kernel.seam, [])
    report.caught += _seal("import")
    if report.caught:  # a candidate that rebinds the judge's clocks is not run under them
        report.verdict = _invalid(report)
        return report
    report.checks = backend.kernel_check(runner, ref, settings.rows, settings.depths)
    report.caught += _seal("check")
    if not report.passed:  # a wrong kernel is never timed: that is its verdict
        report.verdict = _invalid(report)
    return report


def _seal(stage: str) -> list[str]:
    return [f"judge-seal: {problem} (found after the candidate's {stage})" for problem in integrity.broken()]


def _invalid(report: KernelReport) -> Verdict:
    failures = report.failures
    shown = "; ".join(failures[:4]) + (f"; and {len(failures) - 4} more" if len(failures) > 4 else "")
    return Verdict("invalid", f"caught: {shown}")


def _failures(check: KernelCheck) -> list[str]:
    """What failed at one shape, each "guard: what it saw at where"."""
    where = f"{check.rows} rows" + (f" at depth {check.depth}" if check.depth else "") + f" ({check.shape})"
    found = [f"{message} at {where}" for message in check.caught]
    if check.unwritten:
        found.append(f"poisoned-output: {check.unwritten} output elements left unwritten at {where}")
    if check.exact is False:
        found.append(f"exact: claims exactness but differs from stock at {where}")
    if check.tolerance < check.error < math.inf and not check.unwritten:  # inf: no output to compare (said above)
        bits = ""
        if check.dtype == "float32" and 0 < check.error < 1:  # float32 keeps 24 bits; bf16 keeps 8, fp16/TF32 11
            bits = (f"; ≈ {-math.log2(check.error):.0f} significant bits survive of float32's 24: a lower-precision "
                    "path inside a float32 claim")
        found.append(f"{check.trial}: error {check.error:.1e} > {check.tolerance:.1e} at {where}{bits}")
    return found


def measure_shares(backend: Backend, runner: Runner, seam: str, settings: ab.Settings) -> dict[str, float]:
    """The seam's share of prefill and decode, from one profiled window of each against their measured times."""
    prompt = list(range(1, min(settings.prompt, runner.config.max_context - SHARE_STEPS - 2) + 1))
    breakdowns = {}
    for phase, test in (("prefill", Test("pp", len(prompt))), ("decode", Test("tg", SHARE_STEPS))):
        seconds = run_test(runner, test, BenchSettings(repeats=1)).timed.median
        tokens = prompt if phase == "prefill" else SHARE_STEPS
        profile = backend.profile(runner, phase, [] if phase == "prefill" else prompt[:1], tokens)
        breakdowns[phase] = from_profile(profile, seconds / (1 if phase == "prefill" else SHARE_STEPS), None)
    return seam_shares(seam, breakdowns)


def run_kernel(backend: Backend, runner: Runner, ref: str, settings: KernelSettings,
               progress: Callable[[str], None] = lambda what: None) -> KernelReport:
    """Check, then time in isolation, then `ab` of `runner` (A) against it plus `kernel=ref` (B)."""
    progress("checking the kernel at the model's shapes")
    report = check_kernel(backend, runner, ref, settings)
    if not report.passed:
        return report
    progress("timing it in isolation")
    report.timings = backend.kernel_time(runner, ref, settings.time_rows, settings.time_depth)
    report.caught += [m for t in report.timings for m in t.caught] + _seal("timing") + _roofline(backend, runner,
                                                                                                report.timings)
    if report.caught:  # a time the kernel did not earn is no time to judge it by
        report.verdict = _invalid(report)
        return report
    progress("measuring the seam's share of each phase")
    report.shares = measure_shares(backend, runner, report.seam, settings.ab)
    # Amdahl with the isolation speed-up f: the seam's share s can shorten a phase by s·(1 − 1/f) at most, the
    # share ab's no-lever rule is given (a kernel 2× faster on 1% of a step can give 1.005× at best).
    best = max((t.ratio for t in report.timings if t.lane in WARM_LANES and math.isfinite(t.ratio)), default=1.0)
    reachable = {phase: share * max(0.0, 1.0 - 1.0 / best) for phase, share in report.shares.items()}
    runners = {"A": runner, "A'": backend.copy(runner, runner.run_config),
               "B": backend.copy(runner, runner.run_config.plus(LeverSetting(LEVERS["kernel"], ref)))}
    runner.drop_cache()
    try:
        report.ab = ab.run_ab(backend, runners, settings.ab, progress, shares=reachable)
    finally:
        for name in ("A'", "B"):
            backend.release(runners[name])
    report.verdict = report.ab.verdict
    report.caught += _seal("A/B")
    if report.caught:
        report.verdict = _invalid(report)
    return report


def _roofline(backend: Backend, runner: Runner, timings: list[KernelTiming]) -> list[str]:
    """roofline: a lane whose calls ran faster than the bytes and FLOPs they must move allow, on caches emptied
    before every sample (elsewhere a cache may serve the inputs, and a rate over memory bandwidth is no proof)."""
    flushed = [t for t in timings if t.flushed and math.isfinite(t.kernel_seconds)]
    if not flushed:
        return []
    ceilings = backend.ceilings(str(runner.device), runner.dtype)
    found = (kernel_guards.over_roofline(t.kernel_seconds, t.bytes_moved, t.flops, ceilings.bandwidth,
                                         ceilings.matmul_flops) for t in flushed)
    return [f"{message} ({t.lane} lane)" for message, t in zip(found, flushed) if message]


def record(report: KernelReport, ledger: Any, config: dict[str, Any], environment: dict[str, Any]) -> int:
    """One ledger experiment of kind "kernel": the A/B's samples, each failed check as a finding, the row."""
    with ledger.experiment("kernel", config, environment, label=f"{report.kernel} at {report.seam}") as exp:
        for m in (report.ab.measurements if report.ab else []):
            exp.add_measurement(m)
        for check in report.checks:
            for failure in _failures(check):
                exp.add_finding("kernel", failure.split(":")[0], failure, check.to_dict())
        for message in report.caught:
            exp.add_finding("kernel", message.split(":")[0], message, {})
        exp.set_verdict(report.verdict.verdict if report.verdict else None, report.summary())
    return exp.id
