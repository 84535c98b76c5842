"""Proof of execution on MLX: every lever's code counts its own runs in `runner.counters`, per step executed.

`mx.compile` runs the Python of a step only while tracing it; later calls replay the trace without it. So a
compiled step marks itself as being called (`TRACING`), a lever that runs during the call reports itself to that
step instead of counting (`ran`), and the step counts every lever traced into it at each of its calls
(`accelerate.CompiledStep`), the first one included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections import Counter


class Counting(Protocol):
    counters: "Counter"


class TracedCounts(Protocol):
    inside: set[str]


TRACING: list[TracedCounts] = []  # the compiled steps being called, innermost last


def ran(runner: Counting, lever: str) -> None:
    """Count one execution of a lever that runs inside the model, hence maybe inside a compiled step."""
    if TRACING:
        TRACING[-1].inside.add(lever)
    else:
        runner.counters[lever] += 1
