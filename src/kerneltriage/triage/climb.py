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

The stack comes first: every candidate that can simply be switched on (one setting, not approximating, not a weight
format of its own, no speculation) is added, most promising first, as far as the table lets them run together (a
clash is settled by the larger expected gain; a requirement once on opens what needs it), and the whole stack is
judged against the start in one A/B. Where it wins, rounds of leaving one out follow: each member is judged by
removing it (with what requires it) from the stack; the removal that gains most is adopted and the round repeats;
where none gains, the members whose removal changed nothing (`neutral`) are removed together where that holds (not
slower twice); a lever left out is not proposed again. So a lever that helps only beside another
stays, one that loses in combination goes, a no-op goes — and the climb starts its rounds from a graphed, fused step
instead of an eager one whose every measurement is slow and noisy.
Where the stack does not win, the rounds climb from the start one lever at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.levers import LeverSetting
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
    stack: bool = True  # judge the stack of every simple candidate first (False: one lever at a time from the start)

    def __post_init__(self) -> None:
        if self.favor not in FAVORS:
            raise ValueError(f"favor {self.favor!r}: expected one of {FAVORS}")
        self._refused_at_build: dict[str, str] = {}
        self._settled: set[str] = set()  # levers left out of the stack: judged there, not proposed again

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
        base, done = self._stacked(base, ladder) if self.stack else (base, 0)
        for number in range(done + 1, MAX_ROUNDS + 1):
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

    def _stacked(self, base: Base, ladder: Ladder) -> tuple[Base, int]:
        """The stack judged against the start; where it wins, rounds of leaving one out. The base the rounds go on
        from, and the rounds spent."""
        stack, members = self._stack_of(base)
        if len(members) < BUNDLE_MIN:
            return base, 0
        ladder.rounds = 1
        trial = self._judge(1, base, stack)
        ladder.trials.append(trial)
        if self._gain(trial, base) is None:
            return base, 1
        base = self._adopt(base, trial, ladder)
        number = 1
        while number < MAX_ROUNDS and not self.spent:
            number += 1
            ladder.rounds = number
            removal = self._leave_out(number, base, members, ladder)
            if removal is None:
                break
            base = self._adopt(base, removal, ladder)
            self._settled |= {m for m in members if not removal.candidate.config.has(m)}
            members = [m for m in members if removal.candidate.config.has(m)]
            if removal.result is None or removal.result.verdict != "win":
                break  # what changed nothing went; the others were each shown to matter against this very stack
        return base, number

    def _stack_of(self, base: Base) -> tuple[Candidate, list[str]]:
        """Every stackable candidate on top of the base, most promising first, each added where the table lets it
        run beside what was added before it: the stack as one candidate, and its members' lever names."""
        config, members, names = base.config, list[Candidate](), list[str]()
        while True:
            found, _ = self.propose(config, base.breakdowns, self._start)
            fresh = [(c, s) for c in found if (s := _added(config, c)) is not None and _stackable(s)
                     and s.name not in names]
            if not fresh:
                break
            (candidate, setting), config = fresh[0], fresh[0][0].config
            members.append(candidate)
            names.append(setting.name)
        question = members[0].question if members else "dispatch"
        return Candidate("+".join(m.text for m in members), question, config, {}), names

    def _leave_out(self, number: int, base: Base, members: Sequence[str], ladder: Ladder) -> Trial | None:
        """One round of leaving each member out of the base: the removal that gains most, else (none gains) the
        members whose removal is `neutral`, removed together where that holds; None: all stay. A neutral removal
        holds unless it reads slower (the verdict rule's sense: its estimate below the band) twice: once can be the
        noise, and several parts inside the noise one by one can add up to more together."""
        trials = []
        for name in members:
            if self.spent:
                ladder.stop = f"budget spent ({self.seconds:.0f} s) in round {number}"
                break
            config = base.config.without(name)
            trial = self._judge(number, base, Candidate(f"-{name}", "delete", config, {}))
            ladder.trials.append(trial)
            trials.append(trial)
        gains = [(gained, t) for t in trials if (gained := self._gain(t, base)) is not None]
        if gains:
            return max(gains, key=lambda pair: pair[0])[1]
        idle = [t for t in trials if t.result is not None and t.result.verdict == "neutral"]
        if not idle or self.spent:
            return None
        if len(idle) == 1:
            return idle[0] if self._holds(number, base, idle[0], ladder) else None
        config = base.config
        for t in idle:
            config = config.without(t.candidate.text.removeprefix("-"))
        together = self._judge(number, base, Candidate(",".join(t.candidate.text for t in idle), "delete", config, {}))
        ladder.trials.append(together)
        return together if self._holds(number, base, together, ladder) else None

    def _holds(self, number: int, base: Base, removal: Trial, ladder: Ladder) -> bool:
        """A removal judged neutral or faster, and not slower in any phase — or slower only once, judged again."""
        for attempt in range(2):
            result = removal.result
            if result is None or result.verdict not in ("win", "neutral"):
                return False
            if not any(record.get("slower") for record in result.phases.values()):
                return True
            if attempt == 0 and not self.spent:
                removal = self._judge(number, base, removal.candidate)
                ladder.trials.append(removal)
        return False

    def _round(self, number: int, base: Base, ladder: Ladder) -> tuple[Base, bool]:
        base = self.bench.profiled(base)
        found, refused = self.propose(base.config, base.breakdowns, self._start)
        found = [c for c in found if (s := _added(base.config, c)) is None or s.name not in self._settled]
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


def _added(config: RunConfig, candidate: Candidate) -> LeverSetting | None:
    """The setting a lever candidate adds to `config` (None: it adds speculation, not a lever)."""
    return next((s for s in candidate.config.levers if s not in config.levers), None)


def _stackable(setting: LeverSetting) -> bool:
    """Switched on as it is: one setting (no choice, no kernel to name), computes the same function, keeps the
    stock weights' values. Choices, approximations and weight formats are judged one by one in the rounds."""
    lever = setting.lever
    return not lever.takes_value and lever.numerics != "approximates" and not lever.own_values
