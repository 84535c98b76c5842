"""Interleaved pairs of samples, the unit every A/B block is made of: a sampler per runner and test, pairs that
alternate which side runs first (A B, B A, …) so that an order effect cancels, and the sequential form that stops
at the first look which settles the block (core/sequential.py)."""

from __future__ import annotations

from typing import Callable

from kerneltriage.bench.harness import Sample, decode_sample, prefill_sample, prompts_sample
from kerneltriage.bench.workloads import PromptSet, Test, Tokens, tokens_for
from kerneltriage.core import sequential, stats
from kerneltriage.engine.backend import Runner


def sampler_of(runner: Runner, test: Test, prompt_set: PromptSet | None = None) -> Callable[[], Sample]:
    """One sample of `test` on `runner` (a prefill, or a decode after random tokens or after each prompt of a set)."""
    tokens = tokens_for(test, runner.config.vocab_size)
    if test.kind == "pp":
        sample = deep_prefill_sample if tokens.prefix else prefill_sample
        return lambda: sample(runner, tokens)
    if prompt_set is not None:
        return lambda: prompts_sample(runner, prompt_set.prompts, test.n)
    return lambda: decode_sample(runner, tokens, test.n)


def deep_prefill_sample(runner: Runner, tokens: Tokens) -> Sample:
    """A prefill sample after a cache filled with the depth's tokens, untimed, each time: between two such samples the
    other side's runs and the decode samples have reset this runner's cache."""
    runner.reset_cache(len(tokens.prefix) + len(tokens.prompt))
    runner.prefill(tokens.prefix, 0)
    runner.synchronize()
    return prefill_sample(runner, tokens)


def paired(first: Callable[[], Sample], second: Callable[[], Sample], pairs: int,
            tell: Callable[[int], None], start: int = 0) -> tuple[list[Sample], list[Sample]]:
    """`pairs` interleaved samples of two samplers; odd pairs (counted from `start`) run the second one first."""
    xs, ys = [], []
    for i in range(pairs):
        if (start + i) % 2:
            y, x = second(), first()
        else:
            x, y = first(), second()
        xs.append(x)
        ys.append(y)
        tell(i + 1)
    return xs, ys


def sequential_pairs(first: Callable[[], Sample], second: Callable[[], Sample], most: int, band: float,
                tell: Callable[[int], None]) -> tuple[tuple[list[Sample], list[Sample]], stats.Interval]:
    """Interleaved pairs up to each look of `most`, stopping at the first look that settles the block (only a win
    is sought: the climb adopts nothing else); the interval carries the sequential level."""
    xs: list[Sample] = []
    ys: list[Sample] = []
    for look in sequential.looks(most):
        more = paired(first, second, look - len(xs), _shifted(tell, len(xs)), start=len(xs))
        xs += more[0]
        ys += more[1]
        decision = sequential.decide([x.timed / y.timed for x, y in zip(xs, ys)], band, most, show_loss=False)
        if decision.stop:
            break
    return (xs, ys), decision.interval


def _shifted(tell: Callable[[int], None], by: int) -> Callable[[int], None]:
    """`tell` of pair numbers counted on from `by` (the pairs an earlier look ran)."""
    return lambda i: tell(by + i)
