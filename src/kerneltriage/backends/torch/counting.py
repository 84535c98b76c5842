"""Proof of execution: every lever's code counts its own runs in `runner.counters`, per step actually executed.

Under torch.compile a count is not traced (Dynamo would guard on the counter's value and recompile the step
whenever it moved: with fullgraph, a hard failure after 8): the lever reports itself once, at trace time, to the
compiled step being called (`CompiledStep.inside`), which counts it at each of its calls. Under CUDA graphs the
counts the captured call made are undone and replayed at each replay (`graphed.GraphedStep`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from collections import Counter


class Counting(Protocol):
    counters: "Counter"


class TracedCounts(Protocol):
    inside: set[str]


TRACING: list[TracedCounts] = []  # the compiled steps being called, innermost last; tracing reports to them


def traced(lever: str) -> None:
    """At trace time: `lever` runs inside the compiled step being traced (counted once per call of it)."""
    if TRACING:
        TRACING[-1].inside.add(lever)


def ran(runner: Counting, lever: str) -> None:
    """Count one execution of a lever that runs inside the model, hence maybe inside a compiled step."""
    if torch.compiler.is_compiling():
        from torch._dynamo.comptime import comptime  # runs its function at trace time (not imported eagerly: 1.7 s)

        comptime(lambda ctx: traced(ctx.get_local("lever").as_python_constant()))  # no free variables allowed
    else:
        runner.counters[lever] += 1
