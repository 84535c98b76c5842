"""Ops per step as a GPU runs them, counted on any device: the primitives of the graph a step builds, each
`mx.fast` call counted as one primitive, views left out.

MLX builds a step as a graph before evaluating it, and `mx.export_to_dot` lists its primitives. On a GPU each
`mx.fast` call (rms_norm, rope, scaled_dot_product_attention, layer_norm) is one primitive; on the CPU MLX lowers it
to composed ops as it is built. While counting, each fast call records the nodes it lowered to (the nodes of its
output's graph that are not in its inputs'), and those count as one op named after the call. Views (reshape, slice,
transpose, broadcast, …) move no data on a GPU and are not counted.

A compiled step is counted as it is traced, before `mx.compile` fuses its elementwise chains: `mx.compile` is the
identity while counting (an upper bound on what the compiled step launches). Nothing is evaluated: the counts are
of the graph's structure, the same at any depth.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx

from kerneltriage.engine.patching import patched

VIEWS = frozenset({"Broadcast", "BroadcastAxes", "Reshape", "Slice", "Split", "Transpose", "ExpandDims", "Squeeze",
                   "Flatten", "Unflatten", "AsStrided", "StopGradient"})
FAST = ("rms_norm", "rope", "scaled_dot_product_attention", "layer_norm")
_NODE = re.compile(r'\{ (\d+) \[label ="([^"]+)", shape=rectangle\]; \}')  # one primitive of export_to_dot


def graph_nodes(*arrays: mx.array) -> list[tuple[str, str]]:
    """(primitive id, name) of every unevaluated op behind `arrays`, one per application: a compiled function's
    primitive is one object applied at every call, so the same id comes once per call."""
    dot = io.StringIO()
    mx.export_to_dot(dot, *arrays)
    return _NODE.findall(dot.getvalue())


def _ids(*arrays: mx.array) -> set[str]:
    return {node for node, _ in graph_nodes(*arrays)} if arrays else set()


def _arrays(args: Sequence[Any]) -> list[mx.array]:
    return [a for a in args if isinstance(a, mx.array)]


@contextmanager
def fast_calls_recorded(lowered: dict[str, tuple[int, str]]) -> Iterator[None]:
    """While inside, every `mx.fast` call maps the nodes of its own graph to (its call number, its name). Its
    outputs are kept alive until the block ends, so no later node reuses a recorded node's address."""
    kept: list[mx.array] = []

    def wrap(name: str, original: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> mx.array:
            out = original(*args, **kwargs)
            own = _ids(out) - _ids(*_arrays(args), *_arrays(list(kwargs.values())))
            lowered.update({node: (len(kept), name) for node in own})
            kept.append(out)
            return out
        return call

    with ExitStack() as stack:
        for name in FAST:
            stack.enter_context(patched(mx.fast, name, wrap(name, getattr(mx.fast, name))))
        yield


def count_ops(build: Callable[[], Sequence[mx.array]]) -> Counter:
    """Primitive name → count in the graph `build()` returns, fast calls as one each, views left out."""
    lowered: dict[str, tuple[int, str]] = {}
    with fast_calls_recorded(lowered):
        outputs = build()
        nodes = graph_nodes(*outputs)
    counts = Counter(label for node, label in nodes if node not in lowered)
    counts.update(name for _, name in {lowered[node] for node, _ in nodes if node in lowered})
    return Counter({name: n for name, n in counts.items() if name not in VIEWS})


@contextmanager
def uncompiled() -> Iterator[None]:
    """`mx.compile` as the identity: a compiled step built inside is its trace, run eagerly."""
    with patched(mx, "compile", lambda fn, *args, **kwargs: fn):
        yield


def step_ops(runner: Any, phase: str, prompt_length: int) -> Counter:
    """Ops of one prefill of `prompt_length` tokens, or of one decode step after them, the greedy token included
    (`argmax`, as a sampler adds it), on a fresh cache; the cache is dropped after (its writes were never run)."""
    model, token, prompt = runner.model, mx.zeros((1, 1), dtype=mx.int32), mx.zeros((1, prompt_length), dtype=mx.int32)
    mx.eval(model.parameters(), token, prompt)  # a lever's weights left lazy (stacked, repacked) are no op of a step
    runner.drop_cache()
    with uncompiled():
        runner.reset_cache(prompt_length + 1)
        if phase == "prefill":
            counts = count_ops(lambda: [mx.argmax(runner.prefill_step(model, prompt, 0), axis=-1)])
        else:
            counts = count_ops(lambda: [mx.argmax(runner.decode_step(model, token, prompt_length), axis=-1)])
    runner.drop_cache()
    return counts
