"""Robust statistics for timing samples: median, quantiles, IQR, MAD and percentile-bootstrap CIs.

Standard library only. Timing distributions are skewed (a slow tail from interrupts, clock changes),
so everything here is median-based; there is deliberately no mean/stdev helper.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

# MAD × 1.4826 estimates the standard deviation of normally distributed data (1 / Φ⁻¹(3/4)).
MAD_NORMAL_SCALE = 1.4826
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval `[low, high]` at level `confidence`."""

    estimate: float
    low: float
    high: float
    confidence: float

    def contains(self, value: float) -> bool:
        """True when `value` lies inside the interval (bounds included)."""
        return self.low <= value <= self.high


def _require_data(xs: Sequence[float], what: str = "samples") -> None:
    if len(xs) == 0:
        raise ValueError(f"{what}: need at least one value, got none")


def median(xs: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    _require_data(xs)
    return float(statistics.median(xs))


def quantile(xs: Sequence[float], q: float) -> float:
    """The `q`-quantile, 0 ≤ q ≤ 1, by linear interpolation between order statistics.

    This is Hyndman–Fan type 7, the default of numpy and R: position (n − 1)·q in the sorted data.
    """
    _require_data(xs)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q must be in [0, 1], got {q}")
    ordered = sorted(xs)
    position = (len(ordered) - 1) * q
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return float(ordered[below] + (ordered[above] - ordered[below]) * fraction)


def iqr(xs: Sequence[float]) -> float:
    """Interquartile range: 75th minus 25th percentile (type-7 quantiles)."""
    return quantile(xs, 0.75) - quantile(xs, 0.25)


def mad(xs: Sequence[float]) -> float:
    """Raw median absolute deviation, median(|x − median(x)|), in the units of the data (unscaled)."""
    center = median(xs)
    return median([abs(x - center) for x in xs])


def scaled_mad(xs: Sequence[float]) -> float:
    """MAD × 1.4826: a robust estimate of the standard deviation if the data were normal."""
    return MAD_NORMAL_SCALE * mad(xs)


def _percentile_interval(
    estimate: float, replicates: list[float], confidence: float
) -> Interval:
    alpha = 1.0 - confidence
    return Interval(
        estimate=estimate,
        low=quantile(replicates, alpha / 2),
        high=quantile(replicates, 1.0 - alpha / 2),
        confidence=confidence,
    )


def _check_bootstrap_args(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap: confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"bootstrap: resamples must be ≥ 1, got {resamples}")


def _bootstrap(
    n: int, statistic: Callable[[list[int]], float], resamples: int, seed: int
) -> list[float]:
    """`statistic` evaluated on `resamples` index vectors drawn with replacement from range(n)."""
    rng = random.Random(seed)
    indices = range(n)
    return [statistic(rng.choices(indices, k=n)) for _ in range(resamples)]


def bootstrap_median_ci(
    xs: Sequence[float],
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Percentile-bootstrap confidence interval of the median of `xs` (seeded, reproducible)."""
    _require_data(xs)
    _check_bootstrap_args(confidence, resamples)
    data = list(xs)
    replicates = _bootstrap(
        len(data), lambda idx: statistics.median([data[i] for i in idx]), resamples, seed
    )
    return _percentile_interval(median(data), replicates, confidence)


def bootstrap_ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Percentile-bootstrap CI of median(numerator) / median(denominator) for PAIRED series.

    Sample i of both series was taken together (interleaved A B A B …), so each resample draws pair
    indices and keeps pairs intact: drift shared by a pair moves both medians together, and that
    correlation narrows the ratio's spread (resampling the series independently would overstate it).
    """
    _require_data(numerator, "numerator")
    _require_data(denominator, "denominator")
    if len(numerator) != len(denominator):
        raise ValueError(
            f"paired ratio: series lengths differ ({len(numerator)} vs {len(denominator)})"
        )
    _check_bootstrap_args(confidence, resamples)
    top, bottom = list(numerator), list(denominator)
    if min(bottom) <= 0:
        raise ValueError("paired ratio: denominator values must be positive")

    def ratio(idx: list[int]) -> float:
        return statistics.median([top[i] for i in idx]) / statistics.median([bottom[i] for i in idx])

    replicates = _bootstrap(len(top), ratio, resamples, seed)
    return _percentile_interval(median(top) / median(bottom), replicates, confidence)
