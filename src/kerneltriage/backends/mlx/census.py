"""A sync census of the token loop and of a prefill on MLX: every place the host waits for MLX, with its call site.

MLX evaluates lazily, so a host wait happens exactly where Python asks for a value: `mx.eval`, `.item()`,
`.tolist()`, a numpy conversion (`np.array(x)`, `np.asarray(x)`, `__array__`). Those calls are wrapped for the
counted run only and each is counted at the innermost frame outside MLX and this file. `mx.async_eval` schedules work without
waiting: it is counted apart ("scheduled"), not as a sync. Dtype conversions (`astype`) are counted as casts by
kind. MLX builds ops in C++, so there is no per-op count: `ops` is 0 (and says nothing).
"""

from __future__ import annotations

import traceback
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np

from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.sampling import SamplingParams

_MLX_ROOT = str(Path(mx.__file__).parent)  # the mlx package (core, nn, utils)
_THIS_FILE = __file__
GREEDY = SamplingParams()
MAX_SITES = 5
READBACKS = (("eval", mx), ("item", mx.array), ("tolist", mx.array), ("__array__", mx.array))
NUMPY_CONVERSIONS = ("array", "asarray")  # numpy reads an mx.array through its buffer, not `__array__`


@dataclass
class Census:
    """Counts over one run; `per(n)` divides them by tokens or passes."""

    readbacks: Counter = field(default_factory=Counter)  # "call (site)" → count
    scheduled: Counter = field(default_factory=Counter)  # mx.async_eval call sites → count
    casts: Counter = field(default_factory=Counter)  # "float32→bfloat16" → count

    def per(self, n: int) -> dict[str, Any]:
        """The counts per unit (`n` tokens or passes), call sites most frequent first, in the torch census's
        fields (ops, CPU ops and strided copies have no MLX counterpart here: 0)."""
        return {
            "ops": 0.0,
            "readbacks": sum(self.readbacks.values()) / n,
            "readback_sites": {site: count / n for site, count in self.readbacks.most_common(MAX_SITES)},
            "scheduled": sum(self.scheduled.values()) / n,
            "scheduled_sites": {site: count / n for site, count in self.scheduled.most_common(MAX_SITES)},
            "cpu_ops": 0.0, "cpu_op_sites": {},
            "casts": sum(self.casts.values()) / n,
            "cast_kinds": {kind: count / n for kind, count in self.casts.most_common(MAX_SITES)},
            "strided_copies": 0.0,
        }


def call_site() -> str:
    """The innermost frame outside MLX and this file: 'path:line in function'."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_MLX_ROOT) and frame.filename != _THIS_FILE:
            return f"{_short(frame.filename)}:{frame.lineno} in {frame.name}"
    return "unknown"


def _short(path: str) -> str:
    parts = Path(path).parts
    return str(Path(*parts[parts.index("kerneltriage"):])) if "kerneltriage" in parts else path


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("mlx.core.")


@contextmanager
def _wrapped(owner: Any, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def counting(census: Census) -> Iterator[Census]:
    """Count every host wait, schedule and cast made inside the block."""

    def readback(label: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                census.readbacks[f"{label} @ {call_site()}"] += 1
                return original(*args, **kwargs)
            return call
        return make

    def to_numpy(name: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                if args and isinstance(args[0], mx.array):
                    census.readbacks[f"np.{name} @ {call_site()}"] += 1
                return original(*args, **kwargs)
            return call
        return make

    def scheduled(original: Callable) -> Callable:
        def call(*args: Any) -> Any:
            census.scheduled[call_site()] += 1
            return original(*args)
        return call

    def astype(original: Callable) -> Callable:
        def call(self: mx.array, dtype: Any, *args: Any, **kwargs: Any) -> mx.array:
            if self.dtype != dtype:
                census.casts[f"{_dtype(self.dtype)}→{_dtype(dtype)}"] += 1
            return original(self, dtype, *args, **kwargs)
        return call

    with ExitStack() as stack:
        for name, owner in READBACKS:
            stack.enter_context(_wrapped(owner, name, readback("mx.eval" if owner is mx else f".{name}()")))
        for name in NUMPY_CONVERSIONS:
            stack.enter_context(_wrapped(np, name, to_numpy(name)))
        stack.enter_context(_wrapped(mx, "async_eval", scheduled))
        stack.enter_context(_wrapped(mx.array, "astype", astype))
        yield census


def census_prefill(runner: Runner, prompt: Sequence[int]) -> Census:
    """The census of one prefill of `prompt` at depth 0, its logits read as the harness reads them (greedy)."""
    runner.reset_cache(len(prompt))
    with counting(Census()) as census:
        runner.greedy(runner.prefill(prompt, 0))
    return census


def census_decode(runner: Runner, prefix: Sequence[int], tokens: int) -> Census:
    """The census of `tokens` tokens of the runner's token loop (the first, from the prefill, excluded)."""
    runner.reset_cache(len(prefix) + tokens + 1)
    logits = runner.prefill(prefix, 0)
    loop: Iterator[int] = runner.loop(logits, len(prefix), tokens + 1, runner.sampler(GREEDY, prefix))
    next(loop)
    with counting(Census()) as census:
        for _ in loop:
            pass
    return census
