"""The `compile` lever on MLX: the decode step and the speculative verify through `mx.compile`, which traces the
step's graph once per input shape and replays it fused (elementwise chains become one kernel; the per-op work
of building the graph in Python disappears from every later step).

A trace is frozen at its shapes, so the compiled steps run on a static cache (`cache.StaticKVCache`): the position
is an array argument and attention reads a window of slots, a multiple of WINDOW (as the torch backend's CUDA
graphs do), under a mask. The window's size is an argument too (an array of that many slots), so a new window is
a new trace, never a stale one. The cache's arrays are the compiled function's state, read and rewritten at each
call. Counting follows `counting.py`.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.cache import StaticKVCache
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.runner import Runner, StepFn, decode_one, verify_rows
from kerneltriage.core.errors import InputError

WINDOW = 256  # compiled steps attend over a multiple of this many cache slots (mlx-lm grows its cache by 256 too)
MODES = ("default",)  # mx.compile has no modes: torch's max-autotune has no MLX counterpart


class CompiledStep:
    """A step (decode, or a verify of T rows) through `mx.compile`; recompiled when the cache is reallocated."""

    def __init__(self, runner: Runner, step: StepFn) -> None:
        self.runner, self.step = runner, step
        self.inside: set[str] = set()  # levers traced into this step (counting.ran): each call runs them
        self.cache: StaticKVCache | None = None
        self.compiled: Callable | None = None
        self.slots: dict[int, mx.array] = {}

    def __call__(self, model: Model, tokens: mx.array, start: int) -> mx.array:
        cache, rows = model.cache, tokens.shape[1]
        if cache is not self.cache:
            self.cache, self.compiled = cache, self._compile(model, cache)
        window = min(cache.max_len, -(-(start + rows) // WINDOW) * WINDOW)
        slots = self.slots.setdefault(window, mx.arange(window, dtype=mx.int32))
        self.runner.counters["compile=default"] += 1
        counting.TRACING.append(self)  # a trace happens inside this call, or nothing of ours runs at all
        try:
            logits = self.compiled(tokens, mx.array([start], dtype=mx.int32), slots)
        finally:
            counting.TRACING.pop()
        cache.length = start + rows
        for lever in self.inside:
            self.runner.counters[lever] += 1
        return logits

    def _compile(self, model: Model, cache: StaticKVCache) -> Callable:
        def traced(tokens: mx.array, position: mx.array, slots: mx.array) -> mx.array:
            before, cache.position, cache.window = cache.position, position, slots.shape[0]
            try:
                return self.step(model, tokens, None)  # no host position: the cache's array holds it
            finally:
                cache.position, cache.window = before, None  # the trace's placeholders must not outlive it

        return mx.compile(traced, inputs=cache.state, outputs=cache.state)


def compile_steps(runner: Runner, mode: str | None) -> None:
    """dispatch: mx.compile of the decode step and the verify forward, on a static cache."""
    if mode not in MODES:
        raise InputError(f"--levers compile={mode}: MLX compiles one way; expected compile={'|'.join(MODES)}")
    runner.cache_type = StaticKVCache
    runner.decode_step = CompiledStep(runner, decode_one)
    runner.verify_step = CompiledStep(runner, verify_rows)
