"""A lever's measured gain, as `ab` judged it: triage's climb (triage/trials.py) runs every candidate through
`ab` itself — A/A band, alternating pairs, the same correctness check, the same verdict — and keeps this record of
the result. There is no second rule here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kerneltriage.bench.ab import Report

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
    check_seconds: Mapping[str, float] = field(default_factory=dict)  # the check's parts (empty: not checked)

    @property
    def valid(self) -> bool:
        return self.verdict in VALID

    def ratio(self, phase: str) -> float | None:
        """B/A of `phase` (> 1: faster), None when not measured or the A/B is not valid."""
        record = self.phases.get(phase)
        return record["ratio"]["estimate"] if record and self.valid else None

    def to_dict(self) -> dict[str, Any]:
        return {"lever": self.lever, "verdict": self.verdict, "reason": self.reason, "phases": dict(self.phases),
                "correctness": self.correctness, "counters": dict(self.counters),
                "check_seconds": dict(self.check_seconds)}

    @classmethod
    def from_report(cls, lever: str, report: Report) -> "LeverResult":
        summary = report.summary()
        return cls(lever, summary["verdict"], summary["reason"], {p["phase"]: p for p in summary["phases"]},
                   summary["correctness"]["detail"], report.counters.get("B", {}),
                   summary["correctness"]["parts"] | ({"all": summary["correctness"]["seconds"]}
                                                      if summary["correctness"]["checked"] else {}))
