"""The one verdict rule of an A/B comparison (ab, triage, the kernel path and the benchmarks all call it) and the
five-point claim checklist, answered from data.

Ratios are B/A throughput (> 1: B is faster): the median of the per-pair ratios with its order-statistic CI
(`stats.paired_ratio_ci`, whose printed level is the one it has). The noise band is sized by an A/A run of the
baseline against itself: half-width h = the larger distance of the A/A CI's bounds from 1 (never below
MIN_NOISE_BAND), band = [1 − h, 1 + h].

Per phase: **loss** — the B/A CI lies entirely below the band; **no-lever** — otherwise, when the changed op's
share s of the phase is so small that even deleting it (Amdahl: 1 / (1 − s)) stays inside the band; **win** —
the CI lies entirely above the band; **neutral** — anything else (a CI touching the band proves nothing). A phase
is *slower* when its point estimate lies below the band, whatever its CI.

Overall, first match wins: **invalid** — the judge's seal is broken (a clock or numeric flag the measurement relies
on was rebound since it was sealed, `core/integrity.py`: a kernel lever's code patching `time.perf_counter`), outputs
differ beyond tolerance, or a lever's counter stayed at zero;
**contended** — the machine was shared (load readings) or, in a phase whose B/A interval did not clear it, the A/A
band is wider than NOISY_BAND: no verdict (an interval entirely outside even a wide band is more than that noise);
**indicative** — fewer than MIN_PAIRS pairs: what the timing would say, never a win; **traded** — a win in one
phase and another phase slower; **loss** — a loss in some phase; **win** — a win somewhere, no phase slower;
**no-lever** — every phase no-lever; **neutral** — anything else.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Collection, Mapping, Sequence

from kerneltriage.core import integrity
from kerneltriage.core.environment import Snapshot
from kerneltriage.core.measurement import CLOCK_DRIFT_RATIO, TEMPERATURE_DRIFT_C, TREND_RATIO
from kerneltriage.core.stats import Interval

VERDICTS = ("win", "traded", "loss", "neutral", "no-lever", "indicative", "contended", "invalid")
STATUSES = ("ok", "warn", "unknown")
# Floor of the noise band's half-width: a few A/A pairs can give a CI narrower than the real run-to-run
# noise, and an end-to-end difference below 1% is not worth a claim.
MIN_NOISE_BAND = 0.01
# Fewer pairs than this: the interval cannot reach 90% coverage (4 pairs: 87.5%), so no win is claimed.
MIN_PAIRS = 5
# An A/A band wider than this (±50%): the baseline does not even agree with itself; the machine was shared or
# the test is too short to judge anything.
NOISY_BAND = 0.5
# First vs last sustained window differing by more than this: the device did not hold its speed.
SUSTAIN_DRIFT_RATIO = TREND_RATIO


@dataclass(frozen=True)
class Verdict:
    """A verdict (one of VERDICTS) and the one-line reason it follows from."""

    verdict: str
    reason: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: expected one of {VERDICTS}")


@dataclass(frozen=True)
class ChecklistItem:
    """One point of the claim checklist: which point, the answer found in the data, and its status."""

    point: str
    answer: str
    status: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"checklist {self.point}: status {self.status!r} not in {STATUSES}")

    def to_dict(self) -> dict[str, str]:
        """A JSON-ready dict."""
        return asdict(self)


def noise_band(aa: Interval) -> float:
    """Half-width of the A/A noise band: the A/A CI bound farthest from 1, at least MIN_NOISE_BAND."""
    return max(MIN_NOISE_BAND, aa.high - 1.0, 1.0 - aa.low)


def amdahl_ceiling(share: float) -> float:
    """The largest end-to-end speedup from an op taking `share` of the time: deleting it, 1 / (1 − share)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"op share must be in [0, 1], got {share}")
    return math.inf if share == 1.0 else 1.0 / (1.0 - share)


def _ci(ratio: Interval) -> str:
    return f"B/A {ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] ({ratio.confidence:.0%} CI)"


def slower(ratio: Interval, band: float) -> bool:
    """The point estimate lies below the band: this phase got slower, even if its CI reaches into the band."""
    return ratio.estimate < 1.0 - band


def phase_verdict(ratio: Interval, band: float, share: float | None = None) -> Verdict:
    """The verdict of one phase from its B/A CI, the A/A band half-width and, optionally, the op's share."""
    low, high = 1.0 - band, 1.0 + band
    where = f"the A/A band [{low:.3f}, {high:.3f}]"
    if ratio.high < low:
        return Verdict("loss", f"{_ci(ratio)} lies entirely below {where}")
    if share is not None and amdahl_ceiling(share) <= high:
        ceiling = amdahl_ceiling(share)
        return Verdict("no-lever", f"the op is {share:.1%} of the time: even deleting it gives "
                                   f"{ceiling:.3f}×, inside {where}")
    if ratio.low > high:
        return Verdict("win", f"{_ci(ratio)} lies entirely above {where}")
    return Verdict("neutral", f"{_ci(ratio)} is not clear of {where}")


def timing_verdict(phases: Mapping[str, Verdict], slower_phases: Sequence[str]) -> Verdict:
    """What the phases' timings say together (`slower_phases`: point estimate below the band)."""
    wins = [p for p, pv in phases.items() if pv.verdict == "win"]
    losses = [p for p, pv in phases.items() if pv.verdict == "loss"]
    if wins and slower_phases:
        return Verdict("traded", f"faster in {', '.join(wins)}, slower in {', '.join(slower_phases)}")
    if losses:
        return Verdict("loss", f"slower in {', '.join(losses)}")
    if wins:
        return Verdict("win", f"faster in {', '.join(wins)}, no phase slower")
    if all(pv.verdict == "no-lever" for pv in phases.values()):
        return Verdict("no-lever", "the changed op is too small a share of every phase to register")
    return Verdict("neutral", "no phase differs by more than the A/A noise")


def overall_verdict(phases: Mapping[str, Verdict], outputs_match: bool, silent_levers: Sequence[str],
                    outputs_detail: str = "", *, slower_phases: Sequence[str] = (), pairs: int = MIN_PAIRS,
                    contention: str | None = None) -> Verdict:
    """One verdict over all phases; `silent_levers` are levers whose execution counter stayed at zero,
    `contention` a reason the machine was shared (None: quiet). The judge's seal is read first (core.integrity)."""
    if not phases:
        raise ValueError("overall verdict: need at least one phase")
    tampered = integrity.broken()
    if tampered:
        return Verdict("invalid", "judge-seal: " + "; ".join(tampered))
    if not outputs_match:
        return Verdict("invalid", f"outputs differ beyond tolerance: {outputs_detail}".rstrip(": "))
    if silent_levers:
        return Verdict("invalid", f"never executed in the timed runs: {', '.join(silent_levers)}")
    if contention:
        return Verdict("contended", f"no verdict: {contention}")
    timing = timing_verdict(phases, slower_phases)
    if pairs < MIN_PAIRS and timing.verdict != "no-lever":
        return Verdict("indicative", f"{pairs} pairs (fewer than {MIN_PAIRS}): would be {timing.verdict} — "
                                     f"{timing.reason}")
    return timing


def band_contention(bands: Mapping[str, float], cleared: Collection[str] = ()) -> str | None:
    """A reason when an A/A band is too wide to judge anything (NOISY_BAND), else None. A phase in `cleared` (its
    B/A interval lies entirely outside its band: a win or a loss) is decided however wide the band: the eager decode
    host's bimodal noise (A/A ±0.78 on an 8B) must not hide a 7× win whose whole interval sits above it."""
    wide = [f"{phase} ±{band:.2f}" for phase, band in bands.items() if band > NOISY_BAND and phase not in cleared]
    if not wide:
        return None
    return (f"the A/A band ({', '.join(wide)}) is wider than ±{NOISY_BAND:.2f}: the machine was shared or the "
            "test is too short")


def synthetic_item(end_to_end: bool, random_weights: bool) -> ChecklistItem:
    """Point 1: synthetic or end-to-end (Amdahl eats kernels timed alone)."""
    if not end_to_end:
        return ChecklistItem("synthetic-or-end-to-end", "synthetic: an op timed alone, not the model", "warn")
    weights = "; random weights at real shapes (timing only)" if random_weights else ""
    return ChecklistItem("synthetic-or-end-to-end", f"end-to-end: whole-model prefill and decode{weights}", "ok")


def question_item(questions: Mapping[str, str]) -> ChecklistItem:
    """Point 2: which question the candidate's changes answer (lever → question)."""
    if not questions:
        return ChecklistItem("question", "none: the candidate changes nothing", "warn")
    answer = ", ".join(f"{lever} ({question})" for lever, question in questions.items())
    if "kernel" in questions.values():
        return ChecklistItem("question", f"{answer}: a custom kernel races stock code, expect reversion", "warn")
    return ChecklistItem("question", answer, "ok")


def baseline_item(baseline_levers: Sequence[str], evidence: Mapping[str, str | None] | None) -> ChecklistItem:
    """Point 3: was the baseline stock at the right shapes? `evidence` maps a check (e.g. 'attention
    backend') to the problem found, or None when that check passed; absent evidence → unknown."""
    if baseline_levers:
        return ChecklistItem("baseline", f"not stock: the baseline has levers {', '.join(baseline_levers)}", "warn")
    problems = {name: why for name, why in (evidence or {}).items() if why is not None}
    if problems:
        found = "; ".join(f"{name}: {why}" for name, why in problems.items())
        return ChecklistItem("baseline", f"stock engine, but {found}", "warn")
    if not evidence:
        return ChecklistItem("baseline", "stock engine; fast-path gates (e.g. attention fallback) not checked",
                             "unknown")
    return ChecklistItem("baseline", f"stock engine; checked: {', '.join(evidence)}", "ok")


def phases_item(measured: Sequence[str]) -> ChecklistItem:
    """Point 4: prefill and decode both reported (a win in one is invisible in the other)."""
    missing = [p for p in ("prefill", "decode") if p not in measured]
    if missing:
        return ChecklistItem("prefill-and-decode", f"not measured: {', '.join(missing)}", "warn")
    return ChecklistItem("prefill-and-decode", "both measured, apart", "ok")


def _drift(start: Snapshot | None, end: Snapshot | None) -> tuple[list[str], list[str]]:
    """(readings, problems) for clocks and temperature between two snapshots."""
    readings, problems = [], []
    pairs = (("SM clock", "sm_clock_mhz", " MHz", CLOCK_DRIFT_RATIO, True),
             ("memory clock", "memory_clock_mhz", " MHz", CLOCK_DRIFT_RATIO, True),
             ("temperature", "temperature_c", " °C", TEMPERATURE_DRIFT_C, False))
    for name, attr, unit, limit, relative in pairs:
        before, after = (getattr(s, attr, None) for s in (start, end))
        if not before or after is None:
            continue
        readings.append(f"{name} {before}→{after}{unit}")
        change = abs(after / before - 1.0) if relative else abs(after - before)
        if change > limit:
            problems.append(f"{name} moved {before}→{after}{unit}")
    return readings, problems


def thermals_item(start: Snapshot | None, end: Snapshot | None,
                  windows: Mapping[str, tuple[float, float]] | None) -> ChecklistItem:
    """Point 5: thermals — clock/temperature drift over the run and, with a sustained window, the first vs
    last window throughput of each config (`windows`: label → (first rate, last rate))."""
    readings, problems = _drift(start, end)
    changes = {label: last / first - 1.0 for label, (first, last) in (windows or {}).items()}
    problems += [f"{label} {change:+.1%} first→last window" for label, change in changes.items()
                 if abs(change) > SUSTAIN_DRIFT_RATIO]
    readings += [f"{label} {change:+.1%}" for label, change in changes.items()]
    seen = "; ".join(readings) or "no clock or temperature readings on this device"
    if problems:
        return ChecklistItem("thermals", f"drifted: {'; '.join(problems)}", "warn")
    if not windows:
        return ChecklistItem("thermals", f"{seen}; no sustained window (use --sustain)", "unknown")
    return ChecklistItem("thermals", f"held: {seen}", "ok")

