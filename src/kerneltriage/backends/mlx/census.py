"""A sync census of the token loop and of a prefill on MLX: every place the host waits for MLX, with its call site.

MLX evaluates lazily, so a host wait happens exactly where Python asks for a value: `mx.eval`, `.item()`,
`.tolist()`, a numpy conversion (`np.array(x)`, `np.asarray(x)`, `__array__`). Those calls are wrapped for the
counted run only and each is counted at the innermost frame outside MLX and this file. `mx.async_eval` schedules
work without waiting: it is counted apart ("scheduled"), not as a sync. Dtype conversions (`astype`) are counted as
casts by kind. `ops` is the primitives one step builds as a GPU runs them (`graph_ops.py`: each `mx.fast` call one
op, views left out), per prefill of the prompt or per decode step after it, counted on the graph apart from the run.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np

from kerneltriage.backends.mlx import graph_ops
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine import census as counts
from kerneltriage.engine.census import Census

_SKIPPED = (str(Path(mx.__file__).parent), __file__)  # call sites are outside MLX (core, nn, utils) and this file
READBACKS = (("eval", mx), ("item", mx.array), ("tolist", mx.array), ("__array__", mx.array))
NUMPY_CONVERSIONS = ("array", "asarray")  # numpy reads an mx.array through its buffer, not `__array__`


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
    census.scheduled = Counter() if census.scheduled is None else census.scheduled

    def readback(label: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                census.readbacks[f"{label} @ {counts.call_site(_SKIPPED)}"] += 1
                return original(*args, **kwargs)
            return call
        return make

    def to_numpy(name: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                if args and isinstance(args[0], mx.array):
                    census.readbacks[f"np.{name} @ {counts.call_site(_SKIPPED)}"] += 1
                return original(*args, **kwargs)
            return call
        return make

    def scheduled(original: Callable) -> Callable:
        def call(*args: Any) -> Any:
            census.scheduled[counts.call_site(_SKIPPED)] += 1
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
    return counts.census_prefill(runner, prompt, counting, read=True)


def census_decode(runner: Runner, prefix: Sequence[int], tokens: int) -> Census:
    """The census of `tokens` tokens of the runner's token loop (the first, from the prefill, excluded)."""
    return counts.census_decode(runner, prefix, tokens, counting)


def per_unit(runner: Runner, phase: str, prefix: Sequence[int], tokens: Sequence[int] | int) -> dict[str, Any]:
    """The census per prefill (its logits read) or per decode token (engine/census.py: per_unit), with the ops of
    one such step (`ops`, by primitive in `op_kinds`)."""
    per = counts.per_unit(runner, phase, prefix, tokens, counting, read=True)
    built = graph_ops.step_ops(runner, phase, len(prefix) if isinstance(tokens, int) else len(tokens))
    return per | {"ops": float(sum(built.values())), "op_kinds": dict(built.most_common(counts.MAX_SITES))}
