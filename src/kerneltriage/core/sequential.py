"""The sequential pair rule: an A/B block that stops as soon as its interval clears the noise band, or can no
longer clear it, instead of always running its full number of pairs.

Pairs are looked at only at the LOOKS (5, 8, 12, 16 pairs, …, up to the block's most). At each look the
interval is the order-statistic CI of the median pair ratio [r_(j), r_(n+1−j)] (`stats.order_statistic_interval`)
at LOOK_CONFIDENCE. Peeking several times costs coverage: the interval printed at the stop covers the true
median with probability at least 1 − Σ (1 − level at each look taken) (a union bound over the looks, whatever the
stopping rule), and that bound is the level the interval carries. LOOK_CONFIDENCE 0.98 keeps it ≥ 91.9% for
looks at 5, 8, 12 and 16 pairs (misses 6.25% + 0.78% + 0.63% + 0.42%); tests/test_sequential.py checks it by
simulation.

Stop at a look when the interval lies above the band (a win is shown), below it (a loss), or when no later
look can show either (or no win, for a caller that only adopts wins): a win needs fewer than j ratios at or below
the band's top at the look where it is judged, and ratios once counted stay counted (likewise for a loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kerneltriage.core.stats import Interval, order_statistic_interval

LOOKS = (5, 8, 12, 16, 24, 32)  # pairs at which the block is judged (the last one at most the block's pairs)
LOOK_CONFIDENCE = 0.98  # the level asked of each look's interval (the one it reaches at 5 pairs is 93.75%)


def looks(most: int) -> tuple[int, ...]:
    """The looks of a block of at most `most` pairs: LOOKS up to it, and `most` itself as the last."""
    if most < LOOKS[0]:
        raise ValueError(f"sequential pairs: at least {LOOKS[0]} pairs, got {most}")
    return tuple(n for n in LOOKS if n < most) + (most,)


def look_interval(ratios: Sequence[float]) -> Interval:
    """The interval of one look: the order-statistic CI of the median ratio at LOOK_CONFIDENCE (or the level
    its count of pairs reaches)."""
    return order_statistic_interval(ratios, LOOK_CONFIDENCE)


def _rank(n: int) -> int:
    """j of the look at n pairs: its interval is the j-th smallest to the j-th largest ratio."""
    probe = look_interval([float(i) for i in range(n)])
    return int(probe.low) + 1


@dataclass(frozen=True)
class Decision:
    """What one look says: `stop` or go on, and the interval with its sequential level (the union bound)."""

    stop: bool
    reason: str  # "clears the band", "below the band", "cannot clear the band", "last look", "continue"
    interval: Interval


def decide(ratios: Sequence[float], band: float, most: int, show_loss: bool = True) -> Decision:
    """Judge the pairs so far (their count one of `looks(most)`) against the band half-width `band`. Without
    `show_loss` the block also stops once no look can show a win (a caller that only adopts wins)."""
    n = len(ratios)
    taken = [k for k in looks(most) if k <= n]
    if not taken or taken[-1] != n:
        raise ValueError(f"sequential pairs: {n} pairs is not a look of {looks(most)}")
    here = look_interval(ratios)
    level = 1.0 - sum(1.0 - look_interval([float(i) for i in range(k)]).confidence for k in taken)
    interval = Interval(here.estimate, here.low, here.high, max(level, 0.0))
    low, high = 1.0 - band, 1.0 + band
    if here.low > high:
        return Decision(True, "clears the band", interval)
    if here.high < low:
        return Decision(True, "below the band", interval)
    if n == looks(most)[-1]:
        return Decision(True, "last look", interval)
    later = [k for k in looks(most) if k > n]
    at_or_below = sum(r <= high for r in ratios)
    at_or_above = sum(r >= low for r in ratios)
    no_win = all(at_or_below >= _rank(k) for k in later)
    if no_win and (not show_loss or all(at_or_above >= _rank(k) for k in later)):
        return Decision(True, "cannot clear the band", interval)
    return Decision(False, "continue", interval)
