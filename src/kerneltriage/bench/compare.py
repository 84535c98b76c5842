"""kerneltriage beside its peers: every test on every engine, samples interleaved across engines (the harness),
peers opened by the caller (`kerneltriage.peers`): this module times, it loads nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from kerneltriage.bench.harness import Engine, KerneltriageEngine, Progress, Settings, TestResult, run_interleaved
from kerneltriage.bench.workloads import Test, tokens_for
from kerneltriage.engine.backend import Runner

NOT_INSTALLED = "not installed"


@dataclass
class PeerRun:
    """One peer: an engine to interleave, results it produced by itself (a llama-bench binary), tests it
    does not run (test name → why), or why it cannot run at all."""

    name: str
    engine: Engine | None = None
    results: list[TestResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    unavailable: str | None = None
    note: str = ""
    ceilings: Any = None  # kerneltriage on another backend: the ceilings its framework measured


def run_bench(runner: Runner, tests: Sequence[Test], runs: Sequence[PeerRun], settings: Settings,
              progress: Progress | None = None) -> list[TestResult]:
    """Every test on kerneltriage and every peer engine, test by test; the peers' own results appended."""
    ours = KerneltriageEngine(runner)
    results: list[TestResult] = []
    try:
        for test in tests:
            engines: list[Engine] = [ours]
            for engine, run in ((r.engine, r) for r in runs if r.engine is not None):
                why = engine.supports(test)
                if why is None:
                    engines.append(engine)
                else:
                    run.skipped[test.name] = why
            tokens = tokens_for(test, runner.config.vocab_size, settings.seed)
            results += run_interleaved(engines, test, tokens, settings, runner.gpu_index, progress)
    finally:
        for run in runs:
            if run.engine is not None:
                run.engine.close()
    return results + [r for run in runs for r in run.results]
