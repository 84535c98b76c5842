"""The climb's record: every candidate tried in every round (with its `ab` result or why it was not timed), the
rungs it adopted — one per lever, from stock to the final configuration, each with the question it answered, both
phases' ratios with their intervals, the configuration's own measured rates, % of roofline and kernels per token —
why it stopped, and the final confirmation against the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage.candidates import Candidate, Refused
from kerneltriage.triage.measure import LeverResult


@dataclass(frozen=True)
class Trial:
    """One candidate judged in one round against the configuration `base`: `ab`'s result, or None with `note`
    saying why it was not timed (its ceiling inside the noise band, refused when built, the budget spent)."""

    round: int
    candidate: Candidate
    base: str
    result: LeverResult | None
    note: str = ""
    seconds: float = 0.0  # wall time of the judgement: build, warm-up, pairs, check
    warmup: float = 0.0  # build and first (untimed) samples of the candidate: its warm-up cost

    def ratio(self, phase: str) -> float | None:
        return None if self.result is None else self.result.ratio(phase)

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "candidate": self.candidate.to_dict(), "base": self.base,
                "verdict": self.result.verdict if self.result else None,
                "reason": self.result.reason if self.result else self.note, "note": self.note,
                "ratios": {p: self.ratio(p) for p in ("prefill", "decode")},
                "seconds": self.seconds, "warmup_s": self.warmup,
                "ab": self.result.to_dict() if self.result else None}


@dataclass(frozen=True)
class Standing:
    """What one configuration measures, at the climb's test sizes: tok/s, % of roofline and kernels per token."""

    config: RunConfig
    tests: Mapping[str, str]  # phase → test name (pp512, tg16)
    rates: Mapping[str, float]  # phase → tok/s (tokens / median sample time of its A/A block's first side)
    roofline_pct: Mapping[str, float]
    kernels_per_token: float | None  # decode, from its profile (None where there are no kernels: the CPU)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.text, "levers": list(self.config.lever_names),
                "spec": self.config.speculation.label if self.config.speculation else None,
                "tests": dict(self.tests), "rates": dict(self.rates), "roofline_pct": dict(self.roofline_pct),
                "kernels_per_token": self.kernels_per_token}


@dataclass(frozen=True)
class Rung:
    """One adopted step: what it added and the question it answered, the A/B that adopted it (against the rung
    below), and where the configuration stands after it. The first rung is the start (nothing added)."""

    added: str
    question: str
    standing: Standing
    trial: Trial | None = None

    def ratio(self, phase: str) -> dict[str, float] | None:
        """The adopting A/B's ratio of `phase` with its interval, or None (the start)."""
        if self.trial is None or self.trial.result is None:
            return None
        record = self.trial.result.phases.get(phase)
        return None if record is None else dict(record["ratio"])

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "question": self.question, **self.standing.to_dict(),
                "ratios": {p: self.ratio(p) for p in ("prefill", "decode")},
                "verdict": self.trial.result.verdict if self.trial and self.trial.result else None,
                "round": self.trial.round if self.trial else 0,
                "warmup_s": self.trial.warmup if self.trial else 0.0}


@dataclass
class Ladder:
    """The whole climb."""

    rungs: list[Rung]
    trials: list[Trial] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    stop: str = ""
    rounds: int = 0
    seconds: float = 0.0
    bases: list[tuple[str, float]] = field(default_factory=list)  # each configuration measured: (label, seconds)
    confirmation: dict[str, Any] | None = None  # `ab` of the start against the final configuration (summary)
    peer: dict[str, Any] | None = None  # the final configuration beside a peer on the same file

    @property
    def start(self) -> RunConfig:
        return self.rungs[0].standing.config

    @property
    def final(self) -> RunConfig:
        return self.rungs[-1].standing.config

    def command_line(self) -> str:
        """The flags to paste: `--levers a,b --spec suffix` (empty when the start is the best found)."""
        final = self.final
        flags = f"--levers {','.join(final.lever_names)}" if final.levers else ""
        if final.speculation is not None:
            flags += f" --spec {final.speculation.source_text}"
        return flags.strip()

    def to_dict(self) -> dict[str, Any]:
        return {"rungs": [r.to_dict() for r in self.rungs], "final": self.final.text,
                "command_line": self.command_line(), "stop": self.stop, "rounds": self.rounds,
                "seconds": self.seconds, "trials": [t.to_dict() for t in self.trials],
                "refused": [{"lever": r.text, "why": r.why} for r in self.refused],
                "bases": [{"config": label, "seconds": seconds} for label, seconds in self.bases],
                "confirmation": self.confirmation, "peer": self.peer}
