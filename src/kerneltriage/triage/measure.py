"""Measured lever gains for triage: a paired, interleaved A/B on one test, through the bench harness.

A is the runner as configured; B runs a copy of its model with the same levers plus one.
Pairs run A B, A B, …; the gain is median(A) / median(B) with a paired bootstrap interval. The lever's own
execution counter proves that B ran it; greedy tokens (decode tests) must be equal, or — for levers that change
the arithmetic, and on random weights — within `ab`'s logit tolerance.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass
from typing import Any

from kerneltriage.core import stats
from kerneltriage.core.errors import InputError

BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class LeverGain:
    """One lever's A/B: raw seconds of the timed phase per pair, the gain, and the verdict."""

    lever: str
    phase: str
    test: str
    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    gain: float  # median(baseline) / median(candidate): > 1 is faster
    low: float
    high: float
    ran: bool  # the lever's counter moved
    same_tokens: bool | None  # None for prefill tests (no tokens compared)
    verdict: str  # win | loss | neutral | invalid

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(interval: stats.Interval, ran: bool, same_tokens: bool | None) -> str:
    """invalid when the lever did not run or changed the tokens; else by where the interval lies around 1."""
    if not ran or same_tokens is False:
        return "invalid"
    if interval.low > 1:
        return "win"
    return "loss" if interval.high < 1 else "neutral"


def candidate_runner(runner: Any, lever: str) -> Any:
    """A runner on a stock copy of the baseline's model (weights copied on the device: no reload) with the
    baseline's levers plus `lever`. Raises InputError when the lever cannot apply here (e.g. graphs on a CPU)."""
    from kerneltriage.backends.torch.accelerate import apply_levers
    from kerneltriage.backends.torch.load import stock_copy
    from kerneltriage.backends.torch.runner import Runner

    if lever in runner.levers:
        raise InputError(f"lever {lever} is already on")
    model = stock_copy(runner.model)
    return apply_levers(Runner(model, runner.checkpoint, runner.device, runner.dtype), tuple(runner.levers) + (lever,))


def measure_lever(runner: Any, lever: str, test: Any, pairs: int, warmups: int) -> LeverGain:
    """Interleaved A/B of `runner` against `runner` + `lever` on `test` (`warmups` untimed runs each, first)."""
    from kerneltriage.bench.equivalence import check_outputs

    candidate = candidate_runner(runner, lever)
    # A's cache, sized by earlier stages, would outlive into the A/B: B allocates this test's size. A captured step
    # under compile attends over its whole cache, so a bigger one is slower (on an H200, the default model's decode
    # under compile + graphs ran 1.88× slower in a 576-slot cache than in a 17-slot one, and one_sync got the credit).
    runner.model.cache = None
    try:
        a, b = _pairs(runner, candidate, test, pairs, warmups)
        ran = candidate.counters[lever] > 0
        same = None if test.kind == "pp" else all(x.tokens == y.tokens for x, y in zip(a, b))
        if same is False and _tolerant(runner, lever):
            same = check_outputs(runner, candidate).passed
    finally:
        del candidate
        _free_memory(runner.device)
    base = tuple(r.timed.samples[0] for r in a)
    cand = tuple(r.timed.samples[0] for r in b)
    interval = stats.bootstrap_ratio_ci(base, cand, resamples=BOOTSTRAP_RESAMPLES)
    return LeverGain(lever, test.phase, test.name, base, cand, interval.estimate, interval.low, interval.high,
                     ran, same, verdict(interval, ran, same))


def _tolerant(runner: Any, lever: str) -> bool:
    """Differing greedy tokens are expected (and judged by the logit tolerance of `ab`) for levers that change
    the arithmetic, and on random weights, whose near-flat logits make greedy ties common."""
    from kerneltriage.bench.equivalence import NUMERIC_LEVERS

    return runner.config.random_weights or lever in NUMERIC_LEVERS


def _pairs(runner: Any, candidate: Any, test: Any, pairs: int, warmups: int) -> tuple[list, list]:
    from kerneltriage.bench.harness import Settings, run_test

    a, b = [], []
    for i in range(pairs):
        settings = Settings(repeats=1, warmups=warmups if i == 0 else 0)
        a.append(run_test(runner, test, settings))
        b.append(run_test(candidate, test, settings))
    return a, b


def _free_memory(device: Any) -> None:
    """Collect the candidate now (lever closures hold cycles): an 8B copy must not outlive its A/B."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
