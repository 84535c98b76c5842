"""The graphed decode step Q3 looks at after the climb: the final configuration's own step, profiled by its base
(the torch profiler records a graph replay's kernels on recent CUDA, unattributed to op classes), when that
configuration replays its steps from CUDA graphs.
"""

from __future__ import annotations

from kerneltriage.engine.backend import Runner
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.fusion import Structure

GRAPHS = "graphs"  # the lever whose replayed step this looks at


def structure(runner: Runner, levers: tuple[str, ...]) -> Structure:
    """The structural facts the fusion counts need, for `runner`'s model under `levers`."""
    return Structure(runner.config.num_layers, levers, runner.dtype, runner.config.arch, runner.backend)


def final_step(decode: Breakdown | None, config: RunConfig) -> Breakdown | None:
    """The final configuration's decode breakdown when its step is graphed (else None: Q3's dispatch findings and
    the ladder already say what a host-bound step needs)."""
    return decode if decode is not None and config.has(GRAPHS) else None
