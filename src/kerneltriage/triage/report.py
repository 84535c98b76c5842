"""The triage report: every stage's numbers, the findings, their ranking, one line per question, JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from kerneltriage.core.units import format_duration, format_sig
from kerneltriage.triage import amdahl
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.ladder import Ladder
from kerneltriage.triage.q3_dispatch import GRAPHED_STEP

RECOMMEND_MIN_GAIN = 1.02  # below a 2% end-to-end gain a change is not worth recommending
QUESTIONS = ("delete", "fast-path", "dispatch")
QUESTION_TITLES = {"delete": "Q1 can I delete work?", "fast-path": "Q2 can I unlock a fast path?",
                   "dispatch": "Q3 can I cut dispatch/sync overhead?"}
NOTHING = {"delete": "nothing measurable to delete", "fast-path": "no missed fast path found",
           "dispatch": "dispatch and syncs do not limit this workload"}
CONFIDENCE_RANK = {"measured": 0, "estimated": 1, "ceiling": 2, "low": 3}


def _recommendable(finding: Finding) -> bool:
    """A lever is recommended only when `ab` called it a win (the one verdict rule: never traded, neutral,
    indicative, contended or invalid); an estimate without an A/B only when it clears RECOMMEND_MIN_GAIN."""
    ab = finding.evidence.get("ab")
    if ab is not None:
        return ab["verdict"] == "win" and finding.question in QUESTIONS
    return (finding.question in QUESTIONS and finding.confidence != "low"
            and finding.gain >= RECOMMEND_MIN_GAIN)


def rank(findings: list[Finding]) -> list[Finding]:
    """Recommendable findings, measured before estimated before ceilings, larger gains first; one per lever."""
    ordered = sorted(filter(_recommendable, findings), key=lambda f: (CONFIDENCE_RANK[f.confidence], -f.gain))
    seen, ranked = set(), []
    for finding in ordered:
        if finding.lever is None or finding.lever not in seen:
            ranked.append(finding)
            seen.add(finding.lever)
    return ranked


def gain_text(finding: Finding) -> str:
    """'6.20× decode (measured)'."""
    return f"{format_sig(finding.gain)}× {finding.phase} ({finding.confidence})"


def jsonable(value: Any) -> Any:
    """JSON-safe: tuples as lists, inf/nan as None (the ledger refuses non-finite numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


TORCH_GATES = ("flash", "efficient", "cudnn")  # the gate columns when no row names its own (torch on the CPU)


@dataclass
class Report:
    """What triage found, stage by stage (`to_dict` / `to_json` for machines)."""

    config: dict[str, Any]
    setup: dict[str, Any]
    breakdown: dict[str, Breakdown]
    findings: list[Finding]
    gates: list[dict[str, Any]] = field(default_factory=list)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    census: dict[str, Any] = field(default_factory=dict)
    levers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # decode's cost of context (triage/context.py)
    experiment_id: int | None = None
    ladder: Ladder | None = None  # the climb (triage/climb.py)
    final_breakdown: dict[str, Breakdown] = field(default_factory=dict)  # the final configuration's profile
    environment: dict[str, Any] = field(default_factory=dict)  # where and from which commit it ran (provenance)

    def outlook(self) -> dict[str, list[amdahl.Outlook]]:
        """The custom-kernel outlook per phase, on the final configuration's profile where the climb made one:
        every op class's Amdahl ceilings beside the prior."""
        return {phase: amdahl.outlook(b.op_shares) for phase, b in (self.final_breakdown or self.breakdown).items()}

    def recommendations(self) -> list[Finding]:
        """The climb's rungs in the order they were adopted (each a measured win on top of the one below), else
        the ranked findings."""
        if self.ladder is None:
            return rank(self.findings)
        adopted = [rung.added for rung in self.ladder.rungs[1:]]
        by_lever = {f.code.removeprefix("lever-"): f for f in self.findings if f.code.startswith("lever-")}
        return [by_lever[text] for text in adopted if text in by_lever]

    def gate_columns(self) -> tuple[str, ...]:
        """The alternatives the gate rows were probed for, in the backend's order (torch: its SDPA backends; MLX:
        its fused kernel here and on the other devices); torch's backends when no row names any (the CPU)."""
        found = dict.fromkeys(name for row in self.gates for name in row["usable"])
        return tuple(found) or TORCH_GATES

    def fusion_candidates(self) -> list[dict[str, Any]]:
        """The graphed step's fusion candidates, largest ceiling first ([] where Q3 after graphs found nothing)."""
        found = next((f for f in self.findings if f.code == GRAPHED_STEP), None)
        return [] if found is None else list(found.evidence["candidates"])

    def by_question(self, question: str) -> list[Finding]:
        return sorted((f for f in self.findings if f.question == question),
                      key=lambda f: (CONFIDENCE_RANK[f.confidence], -f.gain))

    def answers(self) -> dict[str, str]:
        """One line per question: what the climb adopted for it, else its best finding, or that there is none."""
        best = {f.question: f for f in reversed(self.recommendations())}
        adopted = {q: [f for f in self.recommendations() if f.question == q] for q in QUESTIONS}
        adopted["dispatch"] += [f for f in self.recommendations() if f.question == "kernel"]
        answers = {}
        for q in QUESTIONS:
            if adopted[q]:
                answers[q] = "yes — " + "; ".join(f"{f.fix} ({gain_text(f)})" for f in adopted[q])
                continue
            found = [f for f in self.by_question(q) if f.confidence != "low"]
            if q in best:
                answers[q] = f"yes — {best[q].title} ({gain_text(best[q])})"
            elif found and found[0].confidence == "measured":
                answers[q] = f"nothing above the noise — closest: {found[0].title} ({gain_text(found[0])})"
            elif found:  # a bound, not a measurement: what it is and how to try it
                answers[q] = f"not judged here — {found[0].title}; {found[0].fix} (up to {gain_text(found[0])})"
            else:
                answers[q] = f"no — {NOTHING[q]}"
        return answers

    def regime(self) -> str:
        """What limits decode: the host (dispatch-bound) or the roofline, with its %."""
        decode, numbers = self.breakdown["decode"], self.setup["decode"]
        measured = format_duration(numbers["seconds_per_pass"])
        idle = f"the device is idle {decode.gap_share:.0%} of each step"
        kind = "bandwidth" if numbers["bound"] == "memory" else "compute"
        if decode.dispatch_bound:
            # What the device does once dispatch is gone: its own work against the same floor.
            device_pct = 100 * numbers["floor_seconds_per_pass"] / decode.device_seconds
            return (f"decode is dispatch-bound: {idle} ({measured}/token measured, "
                    f"{format_duration(decode.device_seconds)} of device work); the device work alone is "
                    f"{kind}-bound at {format_sig(device_pct)}% of roofline "
                    f"(floor {format_duration(numbers['floor_seconds_per_pass'])}/token)")
        roof = (f"{format_sig(numbers['roofline_pct'])}% of roofline (floor "
                f"{format_duration(numbers['floor_seconds_per_pass'])}/token, measured {measured}/token)")
        if decode.device_bound:
            return f"decode is {kind}-bound: {roof}"
        return f"decode is partly dispatch-bound ({idle}), {kind} floor: {roof}"

    def headlines(self) -> list[str]:
        """The lines worth quoting: setup, regime, top recommendation, one per question."""
        pre, dec = self.setup["prefill"], self.setup["decode"]
        lines = [f"{self.config['model']} on {self.setup['device']} ({self.setup['dtype']}): "
                 f"prefill {format_sig(pre['rate'])} tok/s ({format_sig(pre['roofline_pct'])}% of roofline), "
                 f"decode {format_sig(dec['rate'])} tok/s ({format_sig(dec['roofline_pct'])}% of roofline)",
                 self.regime()]
        lines.append(self.climb_line())
        lines += [f"{QUESTION_TITLES[q]} {line}" for q, line in self.answers().items()]
        return lines

    def climb_line(self) -> str:
        """Where the climb got — start against final in the confirmation's interleaved A/B where it ran (rates
        measured at different moments are not compared), the rungs, why it stopped, the flags to paste."""
        ladder = self.ladder
        if ladder is None:
            top = rank(self.findings)
            return (f"top lever: {top[0].title} → {top[0].fix} ({gain_text(top[0])})" if top
                    else "top lever: none above the noise")
        paste = ladder.command_line() or "(nothing: the configuration given is the best found)"
        confirmed = ladder.confirmation or {}
        moves = ", ".join(f"{p['phase']} {format_sig(p['a']['tok_s'])} → {format_sig(p['b']['tok_s'])} tok/s "
                          f"({p['ratio']['estimate']:.2f}× [{p['ratio']['low']:.2f}, {p['ratio']['high']:.2f}], "
                          f"{p['test']})" for p in confirmed.get("phases", []))
        verdict = f" (confirmed by ab: {confirmed['verdict']})" if moves else ""
        return (f"climb: {len(ladder.rungs) - 1} rung(s) in {ladder.rounds} round(s)"
                + (f", start → final {moves}{verdict}" if moves else "")
                + f"; stopped: {ladder.stop}; paste: {paste}")

    def to_dict(self) -> dict[str, Any]:
        return jsonable({
            "config": self.config, "setup": self.setup, "headlines": self.headlines(), "answers": self.answers(),
            "breakdown": {phase: b.to_dict() for phase, b in self.breakdown.items()},
            "findings": [f.to_dict() for f in self.findings],
            "recommendations": [f.code for f in self.recommendations()],
            "outlook": {phase: [o.to_dict() for o in rows] for phase, rows in self.outlook().items()},
            "gates": self.gates, "sweep": self.sweep, "context": self.context, "census": self.census,
            "levers": self.levers, "ladder": self.ladder.to_dict() if self.ladder else None,
            "final_breakdown": {phase: b.to_dict() for phase, b in self.final_breakdown.items()},
            "notes": self.notes, "stage_seconds": self.stage_seconds, "experiment_id": self.experiment_id,
            "environment": self.environment,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
