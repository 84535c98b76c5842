"""Robust statistics (known values, type-7 quantiles, bootstrap coverage, total/total rates) and units."""

from __future__ import annotations

import math
import random
import statistics
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kerneltriage.core import stats, units
from kerneltriage.core.measurement import Measurement, MeasurementSpec

TRUE_RATIO = 1.25
TRIALS = 100
PAIRS = 30
RESAMPLES = 500


def test_known_values_odd_count() -> None:
    xs = [3.0, 1.0, 100.0, 2.0, 4.0]
    assert stats.median(xs) == 3.0
    assert stats.quantile(xs, 0.25) == 2.0
    assert stats.quantile(xs, 0.75) == 4.0
    assert stats.iqr(xs) == 2.0
    assert stats.mad(xs) == 1.0  # |x − 3| = 0, 1, 1, 2, 97
    assert stats.scaled_mad(xs) == pytest.approx(stats.MAD_NORMAL_SCALE)


def test_known_values_even_count() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert stats.median(xs) == 2.5
    assert stats.quantile(xs, 0.25) == pytest.approx(1.75)  # position 0.75 between 1 and 2
    assert stats.quantile(xs, 0.75) == pytest.approx(3.25)
    assert stats.iqr(xs) == pytest.approx(1.5)
    assert stats.quantile(xs, 0.0) == 1.0 and stats.quantile(xs, 1.0) == 4.0


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=40))
def test_quartiles_match_statistics_inclusive(xs: list[float]) -> None:
    expected = statistics.quantiles(xs, n=4, method="inclusive")
    got = [stats.quantile(xs, k / 4) for k in (1, 2, 3)]
    assert got == pytest.approx(expected, abs=1e-6)


def test_bad_input_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        stats.median([])
    with pytest.raises(ValueError, match="q must be"):
        stats.quantile([1.0], 1.5)
    with pytest.raises(ValueError, match="lengths differ"):
        stats.bootstrap_ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        stats.bootstrap_median_ci([1.0, 2.0], confidence=1.0)


def test_median_ci_is_seeded_and_brackets_the_median() -> None:
    rng = random.Random(7)
    xs = [rng.lognormvariate(0.0, 0.2) for _ in range(50)]
    first, again = stats.bootstrap_median_ci(xs, seed=3), stats.bootstrap_median_ci(xs, seed=3)
    assert first == again
    assert first.low <= first.estimate <= first.high
    assert first.low < first.high
    assert stats.bootstrap_median_ci([2.0] * 10) == stats.Interval(2.0, 2.0, 2.0, stats.DEFAULT_CONFIDENCE)


def _paired_series(rng: random.Random, shared_sigma: float) -> tuple[list[float], list[float]]:
    """(candidate, baseline): per-pair shared drift × independent lognormal noise; true ratio 1.25."""
    drift = [rng.lognormvariate(0.0, shared_sigma) for _ in range(PAIRS)]
    baseline = [d * rng.lognormvariate(0.0, 0.1) for d in drift]
    candidate = [TRUE_RATIO * d * rng.lognormvariate(0.0, 0.1) for d in drift]
    return candidate, baseline


def test_paired_ratio_ci_covers_the_true_ratio() -> None:
    covered = excluded_one = 0
    for trial in range(TRIALS):
        candidate, baseline = _paired_series(random.Random(trial), shared_sigma=0.05)
        ci = stats.bootstrap_ratio_ci(candidate, baseline, resamples=RESAMPLES, seed=trial)
        covered += ci.contains(TRUE_RATIO)
        excluded_one += not ci.contains(1.0)
    assert covered >= 0.9 * TRIALS
    assert excluded_one >= 0.95 * TRIALS  # and the interval is narrow enough to tell 1.25 from 1.0


def test_keeping_pairs_together_narrows_the_interval() -> None:
    rng = random.Random(11)
    candidate, baseline = _paired_series(rng, shared_sigma=0.3)
    paired = stats.bootstrap_ratio_ci(candidate, baseline, resamples=RESAMPLES)
    unpaired_baseline = baseline[:]
    rng.shuffle(unpaired_baseline)  # same values, pairing destroyed
    unpaired = stats.bootstrap_ratio_ci(candidate, unpaired_baseline, resamples=RESAMPLES)
    assert paired.estimate == pytest.approx(unpaired.estimate)
    assert paired.high - paired.low < 0.8 * (unpaired.high - unpaired.low)


def test_bootstrap_is_fast_enough() -> None:
    rng = random.Random(0)
    a = [rng.lognormvariate(0.0, 0.1) for _ in range(100)]
    b = [x * rng.lognormvariate(0.2, 0.1) for x in a]
    start = time.perf_counter()
    stats.bootstrap_ratio_ci(b, a, resamples=2000)
    assert time.perf_counter() - start < 1.0


def test_rate_is_total_over_total_not_a_mean_of_rates() -> None:
    # 10 tokens in 1 s, then 10 tokens in 0.1 s: 20 tokens / 1.1 s ≈ 18.2 tok/s; mean of rates = 55 tok/s.
    m = Measurement(MeasurementSpec("decode", "decode", units_per_sample=10), samples=(1.0, 0.1))
    mean_of_rates = statistics.fmean(10 / t for t in m.samples)
    assert m.rate == pytest.approx(20 / 1.1)
    assert mean_of_rates == pytest.approx(55.0)
    assert not math.isclose(m.rate, mean_of_rates, rel_tol=0.5)
    assert m.ms_per_unit == pytest.approx(1000 / m.rate)


@pytest.mark.parametrize(
    ("formatted", "expected"),
    [
        (units.format_duration(0.000123), "123 µs"),
        (units.format_duration(0.00099996), "1.00 ms"),  # rounding carries into the next unit
        (units.format_duration(2.5e-9), "2.50 ns"),
        (units.format_duration(125.3), "125 s"),
        (units.format_rate(49_123.4), "49,100 tok/s"),
        (units.format_rate(12.345, "req"), "12.3 req/s"),
        (units.format_bytes(269e6), "269 MB"),
        (units.format_bytes(999), "999 B"),
        (units.format_bytes(1000), "1.00 kB"),
        (units.format_bandwidth(4.19e12), "4.19 TB/s"),
        (units.format_flops(7.84e14), "784 TFLOP/s"),
        (units.format_sig(1_234_567, 2), "1,200,000"),
    ],
)
def test_units_formatting(formatted: str, expected: str) -> None:
    assert formatted == expected


def test_significant_figures() -> None:
    assert units.sig(0.000123456, 2) == 0.00012
    assert units.sig(987_654, 3) == 988_000
    assert units.sig(0.0) == 0.0
    with pytest.raises(ValueError, match="significant"):
        units.sig(1.0, 0)
