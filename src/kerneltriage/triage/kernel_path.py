"""The custom-kernel path: a kernel at a seam of the model is checked in isolation at the model's real shapes,
timed in isolation against the stock op, then judged end to end by `ab` as the lever `kernel=REF` — with the seam's
measured share of each phase passed in, so a kernel that cannot matter is `no-lever`, not a win. A kernel that
fails its check is never timed: the verdict is `invalid`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kerneltriage.bench import ab
from kerneltriage.bench.harness import Settings as BenchSettings
from kerneltriage.bench.harness import run_test
from kerneltriage.bench.workloads import Test
from kerneltriage.core.verdict import Verdict
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.kernels import load_kernel
from kerneltriage.engine.levers import LEVERS, LeverSetting
from kerneltriage.engine.probes import KernelCheck, KernelTiming
from kerneltriage.triage.breakdown import from_profile
from kerneltriage.triage.shares import seam_shares

DECODE_ROWS, VERIFY_ROWS, PREFILL_ROWS = 1, 9, 64  # a decode step, a k = 8 verify, a block of prompt rows
SHARE_STEPS = 8  # decode steps profiled for the seam's share


@dataclass(frozen=True)
class KernelSettings:
    """Where the kernel is checked (row counts, cache depths) and timed, and the end-to-end A/B's workload."""

    rows: tuple[int, ...] = (DECODE_ROWS, VERIFY_ROWS, PREFILL_ROWS)
    depths: tuple[int, ...] = (0, 512)
    time_rows: int = DECODE_ROWS
    time_depth: int = 512
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

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def row(self) -> dict[str, Any]:
        """The kernel ledger's row: kernel, seam, correctness, isolation ratio per lane, end-to-end ratios, verdict."""
        phases = {p.test.phase: p.ratio.estimate for p in self.ab.phases} if self.ab else {}
        failed = [c for c in self.checks if not c.passed]
        return {"kernel": self.kernel, "seam": self.seam,
                "correctness": "ok" if not failed else f"FAIL at {len(failed)} of {len(self.checks)} shapes",
                "worst_error": max((c.error for c in self.checks), default=None),
                "isolation": {t.lane: t.ratio for t in self.timings},
                "prefill": phases.get("prefill"), "decode": phases.get("decode"),
                "shares": self.shares, "verdict": self.verdict.verdict if self.verdict else None,
                "reason": self.verdict.reason if self.verdict else "checked only: not timed"}

    def summary(self) -> dict[str, Any]:
        return {**self.row(), "checks": [c.to_dict() for c in self.checks],
                "timings": [t.to_dict() for t in self.timings], "ab": self.ab.summary() if self.ab else None}


def check_kernel(backend: Backend, runner: Runner, ref: str, settings: KernelSettings) -> KernelReport:
    """Correctness only: every row count and depth, fresh inputs, poisoned outputs."""
    kernel = load_kernel(ref)
    checks = backend.kernel_check(runner, ref, settings.rows, settings.depths)
    report = KernelReport(ref, kernel.seam, checks)
    failed = [c for c in checks if not c.passed]
    if failed:  # a wrong kernel is never timed: that is its verdict
        report.verdict = Verdict("invalid", "kernel check failed: " + "; ".join(_failure(c) for c in failed[:3]))
    return report


def _failure(check: KernelCheck) -> str:
    where = f"{check.rows} rows" + (f" at depth {check.depth}" if check.depth else "") + f" ({check.shape})"
    if check.unwritten:
        return f"{check.unwritten} output elements left unwritten at {where}"
    if check.exact is False:
        return f"claims exactness but differs from stock at {where}"
    return f"error {check.error:.1e} > {check.tolerance:.1e} at {where}"


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
    progress("measuring the seam's share of each phase")
    report.shares = measure_shares(backend, runner, report.seam, settings.ab)
    # Amdahl with the isolation speed-up f: the seam's share s can shorten a phase by s·(1 − 1/f) at most, the
    # share ab's no-lever rule is given (a kernel 2× faster on 1% of a step can give 1.005× at best).
    best = max((t.ratio for t in report.timings), default=1.0)
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
    return report


def record(report: KernelReport, ledger: Any, config: dict[str, Any], environment: dict[str, Any]) -> int:
    """One ledger experiment of kind "kernel": the A/B's samples, each failed check as a finding, the row."""
    with ledger.experiment("kernel", config, environment, label=f"{report.kernel} at {report.seam}") as exp:
        for m in (report.ab.measurements if report.ab else []):
            exp.add_measurement(m)
        for check in report.checks:
            if not check.passed:
                exp.add_finding("kernel", "kernel-check", _failure(check), check.to_dict())
        exp.set_verdict(report.verdict.verdict if report.verdict else None, report.summary())
    return exp.id
