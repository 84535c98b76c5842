"""What an A/B found, as one record: configuration, correctness, counters, phases, sustained window, the claim
checklist and the verdict; its JSON summary and its ledger experiment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from kerneltriage.bench.equivalence import DIGEST_PROMPT_TOKENS, DIGEST_PROMPTS, DIGEST_TOKENS, Correctness
from kerneltriage.bench.workloads import WORKLOAD_SEED, Test
from kerneltriage.core import stats, verdict
from kerneltriage.core.measurement import Measurement
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.paths import shown

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Runner


class Phase(Protocol):
    """One phase of an A/B as the report and its readers read it (ab.Phase, frozen): its test, A/A and A/B blocks,
    the A/B ratio and summary."""

    @property
    def test(self) -> Test: ...
    @property
    def aa(self) -> tuple[Measurement, Measurement]: ...
    @property
    def ab(self) -> tuple[Measurement, Measurement]: ...
    @property
    def ratio(self) -> stats.Interval: ...

    def to_dict(self) -> dict[str, Any]: ...


class Settings(Protocol):
    """An A/B's effort as the report describes it (ab.Settings, frozen)."""

    @property
    def pairs(self) -> int: ...
    @property
    def warmups(self) -> int: ...
    @property
    def sustain(self) -> float: ...

    @property
    def tests(self) -> list[Test]: ...

    def name(self, test: Test) -> str: ...


@dataclass
class Report:
    """Everything an A/B found: config, correctness, counters, phases, sustained window, checklist, verdict."""

    config: dict[str, Any]
    correctness: Correctness
    counters: dict[str, dict[str, int]]
    silent: list[str]
    phases: Sequence[Phase]
    sustained: list[Measurement] = field(default_factory=list)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    checklist: tuple[verdict.ChecklistItem, ...] = ()
    verdict: verdict.Verdict | None = None
    contention: str | None = None
    speculation: dict[str, dict[str, Any]] = field(default_factory=dict)  # side → its draft source's stats

    @property
    def measurements(self) -> list[Measurement]:
        return [m for p in self.phases for m in (*p.aa, *p.ab)] + self.sustained

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.test.phase == name), None)

    def summary(self) -> dict[str, Any]:
        """The JSON-ready result (raw samples are in `measurements`)."""
        c = self.correctness
        assert self.verdict is not None, "a report is summarized once judged"
        return {"verdict": self.verdict.verdict, "reason": self.verdict.reason,
                "phases": [p.to_dict() for p in self.phases],
                "correctness": {"passed": c.passed, "checked": c.checked, "seconds": c.seconds, "parts": c.parts,
                                "detail": c.detail,
                                "digest_a": c.digest_a, "digest_b": c.digest_b, "tokens": c.tokens,
                                "logit_error": c.logit_error, "reference": c.reference, "error_a": c.error_a,
                                "tolerance": c.tolerance,
                                "seams": {s: list(e) for s, e in c.seams.items()}, "timed": c.timed,
                                "quality": {q: list(v) for q, v in c.quality.items()}},
                "counters": self.counters, "silent_levers": self.silent, "contention": self.contention,
                "sustained": {label: {"first_tok_s": f, "last_tok_s": la} for label, (f, la) in self.windows.items()},
                "checklist": [item.to_dict() for item in self.checklist], "speculation": self.speculation}


def checklist(report: Report, a: RunConfig, b: RunConfig, evidence: Mapping[str, str | None] | None
               ) -> tuple[verdict.ChecklistItem, ...]:
    snapshots = sorted((s for m in report.measurements for s in (m.start, m.end) if s is not None),
                       key=lambda s: s.time)
    first, last = (snapshots[0], snapshots[-1]) if snapshots else (None, None)
    changed = {s.text: s.lever.question for s in b.levers if s.text not in a.lever_names}
    if b.speculation is not None and b.speculation != a.speculation:
        changed[f"spec {b.speculation.label}"] = "dispatch"
    baseline = list(a.lever_names) + ([f"spec {a.speculation.label}"] if a.speculation else [])
    return (verdict.synthetic_item(True, report.config["random_weights"]),
            verdict.question_item(changed),
            verdict.baseline_item(baseline, evidence),
            verdict.phases_item([p.test.phase for p in report.phases]),
            verdict.thermals_item(first, last, report.windows))


def describe(runners: Mapping[str, Runner], settings: Settings) -> dict[str, Any]:
    a, b = runners["A"], runners["B"]
    return {"source": shown(a.checkpoint.source), "model": a.config.name, "random_weights": a.config.random_weights,
            "backend": a.backend, "device": str(a.device), "dtype": a.dtype,
            "a": _side(a.run_config), "b": _side(b.run_config),
            "tests": [settings.name(t) for t in settings.tests], "pairs": settings.pairs, "warmups": settings.warmups,
            "sustain_s": settings.sustain, "seed": WORKLOAD_SEED,
            "digest": {"prompts": DIGEST_PROMPTS, "prompt_tokens": DIGEST_PROMPT_TOKENS, "tokens": DIGEST_TOKENS},
            "noise_band_rule": f"A/A CI bound farthest from 1, at least {verdict.MIN_NOISE_BAND}",
            "pair_order": "alternating (A B, B A, …)", "ratio": "median of per-pair ratios, order-statistic CI"}


def _side(config: RunConfig) -> dict[str, Any]:
    return {"text": config.text, "label": config.label, "levers": list(config.lever_names),
            "spec": config.speculation.label if config.speculation else None}


def record(report: Report, ledger: Any, environment: Mapping[str, Any]) -> int:
    """Store the whole A/B as one ledger experiment (all samples, config, verdict, checklist as findings)."""
    a, b = report.config["a"]["label"], report.config["b"]["label"]
    label = f"{report.config['model'] or report.config['source']}: A {a} vs B {b}"
    with ledger.experiment("ab", report.config, environment, label=label) as exp:
        for m in report.measurements:
            exp.add_measurement(m)
        for item in report.checklist:
            exp.add_finding("checklist", item.point, item.answer, {"status": item.status})
        assert report.verdict is not None, "a report is recorded once judged"
        exp.set_verdict(report.verdict.verdict, report.summary())
    return exp.id
