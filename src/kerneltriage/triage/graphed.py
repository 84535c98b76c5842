"""The graphed decode step Q3 looks at after graphs: the triaged runner's own when it is graphed, else — when `ab`
measured `graphs` a win — a graphed copy of it, timed by the bench harness and profiled (the torch profiler records
a graph replay's kernels on recent CUDA, unattributed to op classes).
"""

from __future__ import annotations

from typing import Mapping

from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.levers import LEVERS, LeverSetting
from kerneltriage.triage.breakdown import Breakdown, from_profile
from kerneltriage.triage.fusion import Structure
from kerneltriage.triage.measure import LeverResult
from kerneltriage.triage.setup import Budget, Workload

GRAPHS = LeverSetting(LEVERS["graphs"])


def structure(runner: Runner, graphed: bool) -> Structure:
    """The structural facts the fusion counts need, for `runner` with graphs on where `graphed`."""
    levers = runner.run_config.lever_names + (() if not graphed or runner.run_config.has("graphs") else ("graphs",))
    return Structure(runner.config.num_layers, levers, runner.dtype, runner.config.arch, runner.backend)


def graphed_decode(backend: Backend, runner: Runner, workload: Workload, budget: Budget, baseline: Breakdown,
                   gains: Mapping[str, LeverResult]) -> tuple[Breakdown | None, str | None]:
    """(the graphed decode breakdown or None, a note saying why there is none, where worth saying)."""
    if runner.run_config.has("graphs"):
        return baseline, None
    result = gains.get("graphs")
    if result is None:
        return None, None
    if result.verdict != "win":
        return None, f"graphed step: not profiled — graphs measured {result.verdict}"
    return _profile_copy(backend, runner, workload, budget), None


def _profile_copy(backend: Backend, runner: Runner, workload: Workload, budget: Budget) -> Breakdown:
    """A graphed copy's decode: seconds per token from the harness, kernels from one profiled window."""
    from kerneltriage.bench.harness import Settings, run_test
    from kerneltriage.bench.workloads import Test

    copy = backend.copy(runner, runner.run_config.plus(GRAPHS))
    try:
        test = Test("tg", budget.profile_steps, workload.depth)
        timed = run_test(copy, test, Settings(budget.repeats, max(1, budget.warmups))).timed  # a warm-up captures
        prefix = workload.decode_prefix(runner.config.vocab_size)
        profile = backend.profile(copy, "decode", prefix, budget.profile_steps)
    finally:
        backend.release(copy)
    return from_profile(profile, timed.median / test.n, None)
