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


def _binomial_tail(n: int, k: int) -> float:
    """P(X ≤ k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def order_statistic_interval(xs: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Distribution-free CI of the median of `xs` from their order statistics (the sign-test interval).

    [x_(j), x_(n+1−j)] covers the true median with probability 1 − 2·P(Bin(n, ½) ≤ j − 1) for any continuous
    distribution of independent draws: the widest j whose coverage reaches `confidence` is taken. Too few
    values reach no level at all: then the interval is [min, max] and its `confidence` is the level it has
    (5 values: 93.75%; 4: 87.5%; 3: 75%; 2: 50%), never the level asked for.
    """
    _require_data(xs)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"order-statistic interval: confidence must be in (0, 1), got {confidence}")
    ordered, n = sorted(xs), len(xs)
    j = 1
    while j + 1 <= (n + 1) // 2 and 1 - 2 * _binomial_tail(n, j) >= confidence:
        j += 1  # x_(j+1) still covers at the level asked
    level = 1 - 2 * _binomial_tail(n, j - 1) if n > 1 else 0.0
    return Interval(median(ordered), float(ordered[j - 1]), float(ordered[n - j]), level)


def paired_ratio_ci(numerator: Sequence[float], denominator: Sequence[float],
                    confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """The median of the per-pair ratios numerator_i / denominator_i, with its order-statistic CI.

    Sample i of both series was taken together (interleaved A B, B A …): the ratio within a pair cancels the
    drift both sides share, and the pairs are independent draws of that ratio. Its median is the speed-up a
    typical pair shows; the interval's `confidence` is the level it really has at this many pairs.
    """
    _require_data(numerator, "numerator")
    if len(numerator) != len(denominator):
        raise ValueError(f"paired ratio: series lengths differ ({len(numerator)} vs {len(denominator)})")
    if min(denominator) <= 0:
        raise ValueError("paired ratio: denominator values must be positive")
    return order_statistic_interval([a / b for a, b in zip(numerator, denominator)], confidence)
