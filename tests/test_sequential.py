"""The sequential pair rule (core/sequential.py): its printed level holds by simulation whatever the true ratio,
it stops early on clear and hopeless blocks, and it never stops between looks."""

from __future__ import annotations

import random

import pytest

from kerneltriage.core import sequential

TRIALS = 2000


def _run(true: float, band: float, most: int, rng: random.Random, spread: float = 0.03):
    """One sequential block of pair ratios drawn around `true` (lognormal): (its decision, pairs used)."""
    ratios: list[float] = []
    for look in sequential.looks(most):
        while len(ratios) < look:
            ratios.append(true * rng.lognormvariate(0.0, spread))
        decision = sequential.decide(ratios, band, most, show_loss=False)
        if decision.stop:
            return decision, len(ratios)
    raise AssertionError("the last look always stops")


@pytest.mark.parametrize("true", [0.97, 1.0, 1.015, 1.03, 1.2])
@pytest.mark.parametrize("most", [16, 24])
def test_the_printed_level_holds_under_optional_stopping(true: float, most: int) -> None:
    rng = random.Random(int(true * 1000) + most)
    covered, levels = 0, []
    for _ in range(TRIALS):
        decision, _ = _run(true, 0.02, most, rng)
        covered += decision.interval.contains(true)
        levels.append(decision.interval.confidence)
    assert min(levels) >= 0.90  # what it prints: the union bound over the looks taken, never below 90%
    assert covered / TRIALS >= min(levels) - 0.01  # and the truth is inside at least that often (± Monte Carlo)


def test_a_clear_win_stops_at_the_first_look_and_a_null_soon_after() -> None:
    rng = random.Random(1)
    win, pairs = _run(1.5, 0.02, 24, rng)
    assert win.reason == "clears the band" and pairs == sequential.LOOKS[0]
    null = [_run(1.0, 0.02, 24, rng) for _ in range(200)]
    assert all(d.reason in ("cannot clear the band", "last look", "clears the band") for d, _ in null)
    assert sum(n for _, n in null) / len(null) < 12  # hopeless blocks end within the first looks, not at 24 pairs


def test_looks_and_misuse() -> None:
    assert sequential.looks(16) == (5, 8, 12, 16) and sequential.looks(20) == (5, 8, 12, 16, 20)
    with pytest.raises(ValueError):
        sequential.looks(4)
    with pytest.raises(ValueError, match="not a look"):
        sequential.decide([1.0] * 6, 0.02, 16)


def test_show_loss_keeps_going_where_only_a_loss_is_left_to_show() -> None:
    ratios = [0.96, 0.97, 0.95, 0.975, 0.99]  # no win possible; a loss still is
    assert sequential.decide(ratios, 0.02, 16, show_loss=False).stop
    assert not sequential.decide(ratios, 0.02, 16, show_loss=True).stop
