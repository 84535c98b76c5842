"""Robust statistics (known values, type-7 quantiles, paired-ratio coverage by simulation, total/total rates)
and units."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kerneltriage.core import stats, units, verdict
from kerneltriage.core.measurement import Measurement, MeasurementSpec

TRUE_RATIO = 1.25
TRIALS = 2000  # simulated experiments per coverage check: the coverage estimate's s.e. is ~0.5%
PAIRS = 30


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
        stats.paired_ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        stats.paired_ratio_ci([1.0], [0.0])
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


def _paired_series(rng: random.Random, pairs: int, ratio: float, shared_sigma: float, noise: float
                   ) -> tuple[list[float], list[float]]:
    """(a, b) times: a drift both sides of a pair share × independent lognormal noise; a / b has median `ratio`."""
    drift = [rng.lognormvariate(0.0, shared_sigma) for _ in range(pairs)]
    b = [d * rng.lognormvariate(0.0, noise) for d in drift]
    a = [ratio * d * rng.lognormvariate(0.0, noise) for d in drift]
    return a, b


def _coverage(pairs: int, noise: float, skewed: bool = False) -> tuple[float, float]:
    """(fraction of simulated intervals covering the true ratio, the level they print)."""
    covered, level = 0, None
    for trial in range(TRIALS):
        rng = random.Random(trial)
        a, b = _paired_series(rng, pairs, TRUE_RATIO, 0.3, noise)
        if skewed:  # an occasional slow sample on either side: the timing tail of a shared machine
            a = [x * (3.0 if rng.random() < 0.1 else 1.0) for x in a]
        ci = stats.paired_ratio_ci(a, b)
        covered += ci.contains(TRUE_RATIO)
        level = ci.confidence
    return covered / TRIALS, level


@pytest.mark.parametrize("noise", [0.02, 0.10])
def test_the_interval_at_the_minimum_pair_count_covers_at_least_90_percent(noise: float) -> None:
    coverage, level = _coverage(verdict.MIN_PAIRS, noise)
    assert coverage >= 0.90
    assert level == pytest.approx(1 - 2 * 0.5 ** verdict.MIN_PAIRS)  # 5 pairs: 93.75%, printed as such
    assert abs(coverage - level) < 0.02  # the level printed is the level it has


def test_the_printed_level_is_the_one_it_has_at_every_pair_count() -> None:
    for pairs in (2, 3, 4, 6, 10, 20):
        coverage, level = _coverage(pairs, 0.05)
        assert abs(coverage - level) < 0.03, (pairs, coverage, level)
        assert level >= 0.95 or pairs <= 5  # 95% is asked for; fewer pairs cannot reach it and say so


def test_a_heavy_tail_does_not_break_the_coverage() -> None:
    coverage, level = _coverage(10, 0.05, skewed=True)
    assert level >= 0.95 and coverage >= 0.90


def test_paired_ratio_is_the_median_of_per_pair_ratios() -> None:
    ci = stats.paired_ratio_ci([2.0, 3.0, 10.0, 4.0, 5.0], [1.0, 1.0, 2.0, 2.0, 5.0])  # ratios 2, 3, 5, 2, 1
    assert ci.estimate == 2.0 and (ci.low, ci.high) == (1.0, 5.0) and ci.confidence == pytest.approx(0.9375)


def test_keeping_pairs_together_narrows_the_interval() -> None:
    rng = random.Random(11)
    a, b = _paired_series(rng, PAIRS, TRUE_RATIO, 0.3, 0.05)
    paired = stats.paired_ratio_ci(a, b)
    unpaired_b = b[:]
    rng.shuffle(unpaired_b)  # same values, pairing destroyed: the shared drift no longer cancels
    unpaired = stats.paired_ratio_ci(a, unpaired_b)
    assert paired.contains(TRUE_RATIO) and not paired.contains(1.0)
    assert paired.high - paired.low < 0.5 * (unpaired.high - unpaired.low)


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
