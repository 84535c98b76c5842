"""Amdahl's law for one op class: what the whole step gains when that op gets faster.

An op taking share s of the step, made k× faster, leaves a step of (1 − s) + s/k: the end-to-end
speedup is 1 / (1 − s + s/k); made free (k → ∞), 1 / (1 − s). A kernel 1.3× faster on 3% of the step
gains 1 / (0.97 + 0.03/1.3) ≈ 1.007×.

The custom-kernel outlook sets that ceiling beside the prior that hand-written replacements of stock
kernels come back at 0.5–0.8× of stock speed: on that prior the expected end-to-end result is a loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

HAND_KERNEL_PRIOR = (0.5, 0.8)  # speed of a hand-written kernel relative to stock, the repeated public result
OUTLOOK_FACTOR = 2.0  # "if it became 2× faster"


def speedup(share: float, factor: float) -> float:
    """End-to-end speedup when an op with `share` of the time runs `factor`× faster (inf: free)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"amdahl: share must be in [0, 1], got {share}")
    if not factor > 0:
        raise ValueError(f"amdahl: factor must be positive, got {factor}")
    remaining = 1.0 - share + (0.0 if math.isinf(factor) else share / factor)
    return math.inf if remaining == 0 else 1.0 / remaining


def speedup_if_free(share: float) -> float:
    """End-to-end speedup when the op costs nothing at all: 1 / (1 − share)."""
    return speedup(share, math.inf)


@dataclass(frozen=True)
class Outlook:
    """One op class: its share, the ceilings if it became free or 2× faster, and the prior's range."""

    op: str
    share: float
    if_free: float
    if_2x: float
    prior_low: float  # a hand kernel at HAND_KERNEL_PRIOR[0]× stock speed
    prior_high: float  # … at HAND_KERNEL_PRIOR[1]×

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def outlook(shares: Mapping[str, float]) -> list[Outlook]:
    """The custom-kernel outlook for every op class, largest share first."""
    low, high = HAND_KERNEL_PRIOR
    rows = [Outlook(op, share, speedup_if_free(share), speedup(share, OUTLOOK_FACTOR),
                    speedup(share, low), speedup(share, high))
            for op, share in shares.items()]
    return sorted(rows, key=lambda row: row.share, reverse=True)
