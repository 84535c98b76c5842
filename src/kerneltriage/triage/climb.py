"""The climb: triage's search for the best configuration the engine's own levers reach, judged by `ab`'s one rule.

Round r starts from configuration Cᵣ (C₀: what the user gave), measured and profiled (`Bench.base`). The
candidates (`triage/candidates.py`) are tried most promising first, each as Cᵣ + candidate against Cᵣ: one whose
Amdahl ceiling lies inside the A/A band is `no-lever` without timing; the rest go through `ab` (sequential pairs,
outputs checked where the timing wins). A win this large — RESTART_GAIN in some phase — cuts the round short: the
shares the other ceilings came from no longer describe the step, and levers interact (one sync per step pays only
once the step is graphed), so the rest are judged against the new configuration instead.

Winners are adopted in order of their gain, as `--favor` weighs it (`balanced`: the workload's own time in each
phase; a `traded` lever only where the favoured side gains). The first is adopted on its own A/B; each further one
must win again on top of what was adopted before it (a combination is confirmed, never assumed). Where no candidate
wins alone, the round's neutral candidates that leaned the right way (no phase slower, some phase faster) are tried
together once: small gains inside the noise one by one can clear it as a bundle. The next round measures the new
configuration and asks again; the climb stops when a round adopts nothing, or the budget is spent (it says which):
a round's best winner, judged already, is adopted even where the budget ran out during its round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage.candidates import Candidate, Refused
from kerneltriage.triage.ladder import Ladder, Rung, Standing, Trial
from kerneltriage.triage.measure import LeverResult

FAVORS = ("balanced", "decode", "prefill")
RESTART_GAIN = 1.5  # a win this large in a phase re-measures the step before anything else is judged
MAX_ROUNDS = 12
BUNDLE_MIN = 2  # candidates in a bundle: fewer is a single lever, already judged


class Base(Protocol):
    """A configuration measured and profiled: what its round is judged against."""

    @property
    def config(self) -> RunConfig: ...

    @property
    def breakdowns(self) -> Mapping[str, object]: ...

    @property
    def bands(self) -> Mapping[str, float]:
        """phase → the half-width of its A/A noise band."""

    @property
    def weights(self) -> Mapping[str, float]:
        """phase → the seconds the user's workload spends in it under this configuration."""

    def standing(self) -> Standing: ...


B = TypeVar("B", bound=Base)


class Bench(Protocol[B]):
    """What the climb asks of the measuring side (triage/trials.py, over a backend), on bases of its own kind (`B`)."""

    def base(self, config: RunConfig) -> B: ...

    def profiled(self, base: B) -> B:
        """The base with every phase profiled (a round's ceilings need them all)."""

    def judge(self, base: B, candidate: Candidate) -> tuple[LeverResult | None, str, float]:
        """`ab` of base + candidate against base: (the result, or None with why it could not be built; its warm-up
        seconds)."""

    def release(self, base: B) -> None: ...

    def elapsed(self) -> float:
        """Seconds since the climb began."""


# (configuration, its profile, the start's profile) → the candidates on top of it and what is refused
Propose = Callable[[RunConfig, Mapping[str, Any], Mapping[str, Any]], tuple[list[Candidate], list[Refused]]]
Tell = Callable[[str], None]


def gain(result: LeverResult | None, favor: str, weights: Mapping[str, float], bands: Mapping[str, float]
         ) -> float | None:
    """What adopting it gains as `favor` weighs it, or None when it is not adopted: a `win`, or a `traded` lever
    whose favoured side (balanced: the workload's time) gains beyond the noise."""
    if result is None or result.verdict not in ("win", "traded"):
        return None
    ratios = {phase: result.ratio(phase) or 1.0 for phase in weights}
    if favor == "balanced":
        total = sum(weights.values())
        value = total / sum(seconds / ratios[phase] for phase, seconds in weights.items())
    else:
        value = ratios.get(favor, 1.0)
    if result.verdict == "traded":
        won = favor in result.phases and result.phases[favor]["verdict"] == "win"
        if favor == "balanced" and value <= 1.0 + max(bands.values(), default=0.0):
            return None
        if favor != "balanced" and not won:
            return None
    return value


@dataclass
class Climb:
    """One climb: the bench it measures with, what proposes candidates, how wins are weighed, its time budget."""

    bench: Bench[Any]  # the climb hands back only the bases this bench made
    propose: Propose
    favor: str = "balanced"
    seconds: float = math.inf
    tell: Tell = lambda what: None

    def __post_init__(self) -> None:
        if self.favor not in FAVORS:
            raise ValueError(f"favor {self.favor!r}: expected one of {FAVORS}")
        self._refused_at_build: dict[str, str] = {}

    @property
    def spent(self) -> bool:
        return self.bench.elapsed() >= self.seconds

    def run(self, start: RunConfig) -> tuple[Ladder, Base]:
        """Climb from `start`; the ladder, and the final configuration's base (the caller releases it)."""
        began = self.bench.elapsed()
        base = self.bench.base(start)
        base = self.bench.profiled(base)
        self._start = dict(base.breakdowns)  # the start's profile: op classes for steps whose profile has none
        ladder = Ladder([Rung("", "", base.standing())], bases=[(start.label, self.bench.elapsed() - began)])
        for number in range(1, MAX_ROUNDS + 1):
            if self.spent:
                ladder.stop = f"budget spent ({self.seconds:.0f} s) before round {number}"
                break
            ladder.rounds = number
            self.tell(f"round {number}: from {base.config.label}")
            base, adopted = self._round(number, base, ladder)
            if not adopted:
                ladder.stop = ladder.stop or self._why_nothing(number, ladder)
                break
        else:
            ladder.stop = f"round limit ({MAX_ROUNDS}) reached"
        ladder.seconds = self.bench.elapsed()
        return ladder, base

    def _round(self, number: int, base: Base, ladder: Ladder) -> tuple[Base, bool]:
        base = self.bench.profiled(base)
        found, refused = self.propose(base.config, base.breakdowns, self._start)
        ladder.refused = refused
        trials = self._try_all(number, base, found, ladder)
        winners = sorted((t for t in trials if self._gain(t, base) is not None),
                         key=lambda t: -(self._gain(t, base) or 0.0))
        adopted = False
        for index, trial in enumerate(winners):
            if index and self.spent:  # the best is judged already: adopting it measures the base, no new A/B
                ladder.stop = f"budget spent ({self.seconds:.0f} s) in round {number}"
                break
            if index:  # on top of what this round adopted already: it must win again there
                confirmed = self._confirm(number, base, trial.candidate.text, ladder)
                if confirmed is None:
                    continue
                trial = confirmed
            base = self._adopt(base, trial, ladder)
            adopted = True
        if not adopted and not self.spent:
            bundle = self._bundle(number, base, trials, ladder)
            if bundle is not None:
                base, adopted = self._adopt(base, bundle, ladder), True
        return base, adopted

    @staticmethod
    def _why_nothing(number: int, ladder: Ladder) -> str:
        """Why a round adopted nothing: no candidate won, or the machine was shared so that none could be judged."""
        verdicts = [t.result.verdict for t in ladder.trials if t.round == number and t.result is not None]
        if verdicts and all(outcome == "contended" for outcome in verdicts):
            return (f"round {number}: every A/B was contended (the machine was shared), so none could be judged; "
                    "run it again alone")
        return f"round {number} adopted nothing: no candidate wins"

    def _gain(self, trial: Trial, base: Base) -> float | None:
        return gain(trial.result, self.favor, base.weights, base.bands)

    def _try_all(self, number: int, base: Base, found: Sequence[Candidate], ladder: Ladder) -> list[Trial]:
        """Each candidate in order until one wins by RESTART_GAIN or the budget is spent."""
        trials = []
        for candidate in found:
            if self.spent:
                ladder.stop = f"budget spent ({self.seconds:.0f} s) in round {number}"
                break
            trial = self._judge(number, base, candidate)
            ladder.trials.append(trial)
            trials.append(trial)
            ratios = [trial.ratio(p) or 1.0 for p in base.bands]
            if self._gain(trial, base) is not None and max(ratios) >= RESTART_GAIN:
                self.tell(f"{candidate.text} won {max(ratios):.2f}×: the step is measured again before the rest")
                break
        return trials

    def _judge(self, number: int, base: Base, candidate: Candidate) -> Trial:
        """One candidate against the base: not timed when its ceiling is inside the noise or it was refused when
        built in an earlier round; else `ab`."""
        label = base.config.label
        if candidate.inside(base.bands):
            ceilings = ", ".join(f"{p} {c:.3f}×" for p, c in candidate.ceilings.items())
            return Trial(number, candidate, label, None, f"no-lever: its ceiling ({ceilings}) is inside the A/A band")
        if candidate.text in self._refused_at_build:
            return Trial(number, candidate, label, None, self._refused_at_build[candidate.text])
        self.tell(f"round {number}: {candidate.text}")
        began = self.bench.elapsed()
        result, note, warmup = self.bench.judge(base, candidate)
        if result is None:
            self._refused_at_build[candidate.text] = note
        return Trial(number, candidate, label, result, note, self.bench.elapsed() - began, warmup)

    def _confirm(self, number: int, base: Base, text: str, ladder: Ladder) -> Trial | None:
        """The round's winner `text` again, on top of what was adopted since: the trial if it wins there."""
        found, _ = self.propose(base.config, base.breakdowns, self._start)
        candidate = next((c for c in found if c.text == text), None)
        if candidate is None:
            return None  # what was adopted since refuses it (a clash)
        trial = self._judge(number, base, candidate)
        ladder.trials.append(trial)
        return trial if self._gain(trial, base) is not None else None

    def _bundle(self, number: int, base: Base, trials: Sequence[Trial], ladder: Ladder) -> Trial | None:
        """The round's neutral candidates that leaned the right way, tried together once."""
        leaning = [t.candidate for t in trials if t.result is not None and t.result.verdict == "neutral"
                   and all((t.ratio(p) or 1.0) >= 1.0 for p in base.bands)
                   and any((t.ratio(p) or 1.0) > 1.0 for p in base.bands)]
        config, members = base.config, list[Candidate]()
        for candidate in leaning:
            found, _ = self.propose(config, base.breakdowns, self._start)
            joined = next((c for c in found if c.text == candidate.text), None)
            if joined is not None:
                config, members = joined.config, members + [joined]
        if len(members) < BUNDLE_MIN:
            return None
        bundle = Candidate("+".join(m.text for m in members), members[0].question, config, {})
        trial = self._judge(number, base, bundle)
        ladder.trials.append(trial)
        return trial if self._gain(trial, base) is not None else None

    def _adopt(self, base: Base, trial: Trial, ladder: Ladder) -> Base:
        """The trial's configuration becomes the base: measured and profiled, one rung up."""
        self.tell(f"adopted {trial.candidate.text}")
        began = self.bench.elapsed()
        new = self.bench.base(trial.candidate.config)
        ladder.bases.append((new.config.label, self.bench.elapsed() - began))
        self.bench.release(base)
        ladder.rungs.append(Rung(trial.candidate.text, trial.candidate.question, new.standing(), trial))
        return new
