"""What the climb may try in a round: every lever of the table that can run beside the configuration (model,
backend, device, requirements and clashes, read from the table), the kernel ledger's winning kernels, and
speculation's lookup sources when real prompts are given — each with its Amdahl ceiling from the shares measured
under the current configuration, and what was left out with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from kerneltriage.core.verdict import NOISY_BAND, amdahl_ceiling
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.levers import LEVERS, QUESTIONS, TABLE, LeverSetting, Place, refusal
from kerneltriage.engine.speculative.config import LOOKUP_SOURCES, Speculation
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.shares import estimated_shares, lever_shares

SPEC_QUESTION = "dispatch"  # a verify of k + 1 rows costs about one step: fewer sequential steps per token
SPEC_ESTIMATE = 1.0  # speculation's expected gain for the order of trials: unknown from a profile, so last
BUDGETS = ("quick", "full")  # quick: no lever whose warm-up is slow (engine/levers.py SLOW_WARMUP); full: every one


@dataclass(frozen=True)
class Candidate:
    """One thing to try on top of the configuration: `text` as the user would write it, the question it answers,
    the configuration it makes, its Amdahl ceiling per phase (phases with no known share left out) and its
    warm-up seconds on this backend."""

    text: str
    question: str
    config: RunConfig
    ceilings: Mapping[str, float]
    warmup: float = 0.0
    shares: Mapping[str, float] | None = None  # phase → the share it can change (ab's no-lever input)
    estimate: float = math.inf  # the gain expected (shares.estimated_shares): the order candidates are tried in

    @property
    def ceiling(self) -> float:
        """The largest gain it could bring to any phase; unknown shares count as unbounded."""
        return math.inf if len(self.ceilings) < 2 else max(self.ceilings.values())

    def inside(self, bands: Mapping[str, float]) -> bool:
        """Every phase's ceiling lies inside its A/A band: no measurement could show a gain (no-lever). Never on a
        band so wide that the base did not agree with itself (a shared machine: that says nothing of the lever)."""
        if any(band > NOISY_BAND for band in bands.values()):
            return False
        return len(self.ceilings) == 2 and all(self.ceilings[p] <= 1.0 + bands.get(p, 0.0) for p in self.ceilings)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "question": self.question, "config": self.config.text,
                "ceilings": dict(self.ceilings), "warmup_s": self.warmup}


@dataclass(frozen=True)
class Refused:
    """A lever the table (or the budget) keeps out of the round, and why."""

    text: str
    why: str


def settings_of(lever_name: str, kernels: Sequence[str]) -> list[LeverSetting]:
    """Every way to switch a lever on: each of its choices, each winning kernel for `kernel`, else itself."""
    lever = LEVERS[lever_name]
    if lever.choices:
        return [LeverSetting(lever, choice) for choice in lever.choices]
    if lever.value_pattern is not None:
        return [LeverSetting(lever, ref) for ref in kernels]
    return [LeverSetting(lever)]


def _gains(shares: Mapping[str, float]) -> dict[str, float]:
    return {phase: amdahl_ceiling(min(share, 1.0)) for phase, share in shares.items()}


def _candidate(config: RunConfig, setting: LeverSetting, breakdowns: Mapping[str, Breakdown], backend: str,
               reference: Mapping[str, Breakdown] | None, deletable: float = 1.0) -> Candidate:
    shares = {phase: share * deletable for phase, share in lever_shares(setting, breakdowns).items()}
    expected = _gains({phase: share * deletable
                       for phase, share in estimated_shares(setting, breakdowns, reference).items()})
    estimate = math.inf if len(expected) < 2 else max(expected.values())
    return Candidate(setting.text, setting.lever.question, config.plus(setting), _gains(shares),
                     setting.lever.warmup_seconds(backend), shares, estimate)


def candidates(config: RunConfig, place: Place, breakdowns: Mapping[str, Breakdown], budget: str = "quick",
               kernels: Sequence[str] = (), speculate: bool = False, routed: frozenset[str] | None = None,
               reference: Mapping[str, Breakdown] | None = None, deletable: Mapping[str, float] | None = None
               ) -> tuple[list[Candidate], list[Refused]]:
    """The round's candidates, most promising first (largest ceiling; ties in the questions' order), and what the
    table or the budget refuses. A lever already on (with any value) is not a candidate; a gated one (it routes
    attention elsewhere) only where the gate audit named it (`routed`; None: every one). `reference`: a profile that
    attributes op classes (the start's), for the expected gains of a step whose profile does not (a graph replay).
    `deletable`: lever → the fraction of its seams' share Q1 measured it can delete (sparse-V: the V half of attention
    times the V rows nobody attends to; 0 where it cannot be measured, random weights), its ceiling scaled by it."""
    if budget not in BUDGETS:
        raise ValueError(f"budget {budget!r}: expected one of {BUDGETS}")
    found, refused = [], []
    for lever in TABLE:
        if config.has(lever.name):
            continue
        for setting in settings_of(lever.name, kernels):
            why = refusal(setting, config.levers, place)
            if why is None and lever.gated and routed is not None and setting.text not in routed:
                why = "the gate audit (Q2) found no attention call it would move to a faster path"
            if why is None and budget == "quick" and lever.slow_to_warm(place.backend):
                why = (f"warm-up ~{lever.warmup_seconds(place.backend):.0f} s (compilation): measured with "
                       "--budget full")
            if why is not None:
                refused.append(Refused(setting.text, why))
                continue
            found.append(_candidate(config, setting, breakdowns, place.backend, reference,
                                    (deletable or {}).get(lever.name, 1.0)))
    if speculate and config.speculation is None:  # its gain is the text's, not a profile's: tried after the levers
        found += [Candidate(f"spec={source}", SPEC_QUESTION, RunConfig(config.levers, Speculation(source)), {},
                            estimate=SPEC_ESTIMATE) for source in LOOKUP_SOURCES]
    return ordered(found), refused


def ordered(found: Iterable[Candidate]) -> list[Candidate]:
    """Largest expected gain first; ties in the order the questions are asked (delete, fast path, dispatch,
    kernel)."""
    return sorted(found, key=lambda c: (-c.estimate, QUESTIONS.index(c.question)))


def winning_kernels(ledger: Any, model: str) -> list[str]:
    """The kernels the kernel path judged a win on this model, newest first (the ledger's `kernel` experiments)."""
    if ledger is None:
        return []
    refs = [record.summary.get("kernel") for record in reversed(ledger.all_experiments())
            if record.kind == "kernel" and record.verdict == "win"
            and model in (record.config.get("model"), record.config.get("source"))]
    return list(dict.fromkeys(ref for ref in refs if isinstance(ref, str)))
