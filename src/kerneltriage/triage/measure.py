"""Measured lever gains for triage: each lever's A/B runs through `ab` itself — A/A band, alternating pairs, the
same correctness check, the same verdict — with triage's measured op shares (so `no-lever` can be reached) and
its gate audit (checklist point 3) passed in. There is no second rule here.

A is the runner as configured; A' and B run on stock copies of its weights (made on the device, no reload),
A' with A's levers, B with them plus the lever. Both phases are measured, prefill and decode apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kerneltriage.bench.ab import Report, Settings, run_ab
from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.levers import LeverSetting

VALID = ("win", "traded", "loss", "neutral", "no-lever", "indicative")  # verdicts that carry a measured ratio


@dataclass(frozen=True)
class LeverResult:
    """One lever's A/B, as `ab` judged it: the verdict and, per phase, the B/A ratio, its CI and the A/A band."""

    lever: str
    verdict: str
    reason: str
    phases: Mapping[str, Mapping[str, Any]]  # phase → the `ab` phase record (test, ratio, aa_ratio, band, verdict)
    correctness: str
    counters: Mapping[str, int]

    @property
    def valid(self) -> bool:
        return self.verdict in VALID

    def ratio(self, phase: str) -> float | None:
        """B/A of `phase` (> 1: faster), None when not measured or the A/B is not valid."""
        record = self.phases.get(phase)
        return record["ratio"]["estimate"] if record and self.valid else None

    def to_dict(self) -> dict[str, Any]:
        return {"lever": self.lever, "verdict": self.verdict, "reason": self.reason, "phases": dict(self.phases),
                "correctness": self.correctness, "counters": dict(self.counters)}

    @classmethod
    def from_report(cls, lever: str, report: Report) -> "LeverResult":
        summary = report.summary()
        return cls(lever, summary["verdict"], summary["reason"], {p["phase"]: p for p in summary["phases"]},
                   summary["correctness"]["detail"], report.counters.get("B", {}))


def measure_lever(backend: Backend, runner: Runner, setting: LeverSetting, settings: Settings,
                  shares: Mapping[str, float] | None = None, evidence: Mapping[str, str | None] | None = None,
                  progress: Callable[[str], None] | None = None) -> LeverResult:
    """`ab` of `runner` (A) against a copy with `setting` added (B), A' a copy of A. An InputError when the
    lever cannot apply here (e.g. graphs on a CPU), before anything is timed."""
    config = runner.run_config.plus(setting)
    candidate = backend.copy(runner, config)
    twin = backend.copy(runner, runner.run_config)
    # A's cache, sized by earlier stages, must not outlive into the A/B: a captured step under compile attends
    # over its whole cache, so a bigger one is slower (on an H200, the default model's decode under compile +
    # graphs ran 1.88× slower in a 576-slot cache than in a 17-slot one, and one_sync got the credit).
    runner.drop_cache()
    try:
        report = run_ab(backend, {"A": runner, "A'": twin, "B": candidate}, settings,
                        progress or (lambda what: None), shares, evidence)
    finally:
        for copy in (candidate, twin):
            backend.release(copy)
        runner.drop_cache()
    return LeverResult.from_report(setting.text, report)


def try_lever(backend: Backend, runner: Runner, setting: LeverSetting, settings: Settings,
              shares: Mapping[str, float] | None, evidence: Mapping[str, str | None] | None,
              notes: list[str], progress: Callable[[str], None] | None = None) -> LeverResult | None:
    """`measure_lever`, or a note saying why the lever was not measured (it cannot apply here)."""
    try:
        return measure_lever(backend, runner, setting, settings, shares, evidence, progress)
    except InputError as exc:
        notes.append(f"{setting.text}: not measured — {exc}")
        return None
