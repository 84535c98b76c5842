"""One measurement: a frozen spec of what was timed, the raw samples, warm-ups kept apart, and checks.

Statistics are derived on demand from the raw samples (seconds), never stored instead of them.
The rate is total units / total time — a mean of per-sample rates overweights the fast samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from kerneltriage.core import stats
from kerneltriage.core.environment import Snapshot

# IQR / median above this: the run-to-run noise is too large for a 10% effect to mean anything.
HIGH_SPREAD_RATIO = 0.10
# Fewer samples than this: median and IQR are not yet stable.
MIN_SAMPLES = 5
# SM or memory clock moved by more than this fraction between the start and the end of the run.
CLOCK_DRIFT_RATIO = 0.05
# GPU temperature changed by more than this many °C during the run (sustained ≠ first second).
TEMPERATURE_DRIFT_C = 10
# Median of the last third of the samples differs from the first third by more than this fraction.
TREND_RATIO = 0.10
# A trend needs this many samples to be told apart from noise.
TREND_MIN_SAMPLES = 9


@dataclass(frozen=True)
class Check:
    """A warning about a measurement: a stable code, what was seen, and what to do about it."""

    code: str
    message: str
    advice: str


def _frozen_times(values: Iterable[float], what: str) -> tuple[float, ...]:
    times = tuple(float(v) for v in values)
    for t in times:
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"{what}: every time must be a positive number of seconds, got {t}")
    return times


@dataclass(frozen=True)
class MeasurementSpec:
    """What was measured: a label, the phase (prefill, decode, …), units of work per sample, and params."""

    label: str
    phase: str
    units_per_sample: float
    unit: str = "tok"
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.label or not self.phase or not self.unit:
            raise ValueError(f"measurement spec: label, phase and unit must be non-empty, got {self}")
        if not (math.isfinite(self.units_per_sample) and self.units_per_sample > 0):
            raise ValueError(f"measurement spec: units_per_sample must be > 0, got {self.units_per_sample}")
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "label": self.label,
            "phase": self.phase,
            "units_per_sample": self.units_per_sample,
            "unit": self.unit,
            "params": dict(self.params),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasurementSpec:
        """Inverse of `to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class Measurement:
    """Raw timing samples (seconds) of one spec, warm-ups apart, and run-start/run-end snapshots."""

    spec: MeasurementSpec
    samples: tuple[float, ...]
    warmups: tuple[float, ...] = ()
    start: Snapshot | None = None
    end: Snapshot | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", _frozen_times(self.samples, f"{self.spec.label} samples"))
        object.__setattr__(self, "warmups", _frozen_times(self.warmups, f"{self.spec.label} warm-ups"))
        if not self.samples:
            raise ValueError(f"{self.spec.label}: a measurement needs at least one sample")

    @property
    def n(self) -> int:
        """Number of (non-warm-up) samples."""
        return len(self.samples)

    @property
    def median(self) -> float:
        """Median sample, seconds."""
        return stats.median(self.samples)

    @property
    def iqr(self) -> float:
        """Interquartile range of the samples, seconds."""
        return stats.iqr(self.samples)

    @property
    def mad(self) -> float:
        """Raw (unscaled) median absolute deviation of the samples, seconds."""
        return stats.mad(self.samples)

    @property
    def spread(self) -> float:
        """IQR / median: relative run-to-run noise."""
        return self.iqr / self.median

    @property
    def total_time(self) -> float:
        """Sum of the samples, seconds."""
        return math.fsum(self.samples)

    @property
    def total_units(self) -> float:
        """Units of work over all samples."""
        return self.spec.units_per_sample * self.n

    @property
    def rate(self) -> float:
        """Units per second = total units / total time (never a mean of per-sample rates)."""
        return self.total_units / self.total_time

    @property
    def ms_per_unit(self) -> float:
        """Milliseconds per unit = total time / total units (the inverse of `rate`)."""
        return 1000.0 * self.total_time / self.total_units

    def median_ci(self, confidence: float = stats.DEFAULT_CONFIDENCE) -> stats.Interval:
        """Percentile-bootstrap confidence interval of the median sample (seeded)."""
        return stats.bootstrap_median_ci(self.samples, confidence=confidence)

    def warnings(self) -> tuple[Check, ...]:
        """Everything that makes this measurement less trustworthy than its median suggests."""
        found = (
            _check_few_samples(self),
            _check_spread(self),
            _check_trend(self),
            *_check_clocks(self.start, self.end),
            _check_temperature(self.start, self.end),
            _check_battery(self.start, self.end),
        )
        return tuple(c for c in found if c is not None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict holding the raw samples (statistics are re-derived on load)."""
        return {
            "spec": self.spec.to_dict(),
            "samples": list(self.samples),
            "warmups": list(self.warmups),
            "start": None if self.start is None else self.start.to_dict(),
            "end": None if self.end is None else self.end.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Inverse of `to_dict`."""
        start, end = data.get("start"), data.get("end")
        return cls(
            spec=MeasurementSpec.from_dict(data["spec"]),
            samples=tuple(data["samples"]),
            warmups=tuple(data.get("warmups", ())),
            start=None if start is None else Snapshot.from_dict(start),
            end=None if end is None else Snapshot.from_dict(end),
        )


def _check_few_samples(m: Measurement) -> Check | None:
    if m.n >= MIN_SAMPLES:
        return None
    return Check(
        "few-samples",
        f"{m.spec.label}: only {m.n} samples (fewer than {MIN_SAMPLES})",
        "take more samples; median and IQR are not stable yet",
    )


def _check_spread(m: Measurement) -> Check | None:
    if m.spread <= HIGH_SPREAD_RATIO:
        return None
    return Check(
        "high-spread",
        f"{m.spec.label}: IQR is {m.spread:.0%} of the median (above {HIGH_SPREAD_RATIO:.0%})",
        "close other workloads, warm up longer or use larger inputs; a difference inside the noise is noise",
    )


def _check_trend(m: Measurement) -> Check | None:
    if m.n < TREND_MIN_SAMPLES:
        return None
    third = m.n // 3
    first, last = stats.median(m.samples[:third]), stats.median(m.samples[-third:])
    change = last / first - 1.0
    if abs(change) <= TREND_RATIO:
        return None
    return Check(
        "sample-trend",
        f"{m.spec.label}: the last third of the samples is {change:+.0%} vs the first third",
        "the device is drifting (thermals, clocks, caches); warm up longer or measure a sustained window",
    )


def _check_clocks(start: Snapshot | None, end: Snapshot | None) -> tuple[Check | None, ...]:
    if start is None or end is None:
        return ()
    return (
        _clock_drift("SM", start.sm_clock_mhz, end.sm_clock_mhz),
        _clock_drift("memory", start.memory_clock_mhz, end.memory_clock_mhz),
    )


def _clock_drift(name: str, before: int | None, after: int | None) -> Check | None:
    if not before or after is None or abs(after / before - 1.0) <= CLOCK_DRIFT_RATIO:
        return None
    return Check(
        "clock-drift",
        f"{name} clock moved from {before} to {after} MHz during the run",
        "the GPU throttled or boosted mid-run; check power and thermals and re-measure (never change clocks)",
    )


def _check_temperature(start: Snapshot | None, end: Snapshot | None) -> Check | None:
    if start is None or end is None or start.temperature_c is None or end.temperature_c is None:
        return None
    if abs(end.temperature_c - start.temperature_c) <= TEMPERATURE_DRIFT_C:
        return None
    return Check(
        "temperature-drift",
        f"GPU temperature went from {start.temperature_c} to {end.temperature_c} °C during the run",
        "sustained speed differs from the first seconds; report a sustained window or let the GPU settle",
    )


def _check_battery(start: Snapshot | None, end: Snapshot | None) -> Check | None:
    if not any(s is not None and s.on_battery for s in (start, end)):
        return None
    return Check(
        "on-battery",
        "the machine ran on battery power",
        "plug in: power-saving policies on battery lower clocks and add noise",
    )
