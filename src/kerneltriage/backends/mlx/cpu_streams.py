"""The `cpu_streams` lever: on MLX's CPU device every projection's output rows split across one CPU stream per core.

MLX runs each stream's ops on one thread, and its CPU matmuls use no other (on Linux the `mlx[cpu]` wheel's float32
matmul is reference BLAS, its quantized one a scalar loop, `qmm_t`): a decode step on 2 cores keeps one busy. MLX's
own streams are the fast path left unused — the rows of each projection (the packed ones and the output head
included) go to the streams in near-equal parts, the first on the default stream, and one concatenate joins them.
Each output row is the same dot product over the same values in the same order: the lever is exact (greedy tokens
equal; `tests/test_mlx_cpu_streams.py`). One 1,536 × 576 float32 product at M = 1 took 1.45 ms on one stream and
0.75 ms on two on the 2-core machine, a dependent chain of such products 1.7× less
(`benchmarks/results/mlx-cpu-streams-probe.txt`).
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.quant import QuantizedEmbedding, QuantizedLinear
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.core.contention import cpu_count

ROW_ARRAYS = ("weight", "scales", "biases", "bias")  # the arrays of a Linear / QuantizedLinear indexed by output row
MIN_ROWS = 64  # a part keeps at least this many rows: smaller projections stay whole


def cores() -> int:
    """The cores this process may run on."""
    return cpu_count() or 1


class _Parts:
    """The row parts and their streams, held outside the module tree (not parameters: the whole module keeps the
    weights, the parts are views of its rows)."""

    def __init__(self, parts: list[nn.Module], streams: list[mx.Stream]) -> None:
        self.parts, self.streams = parts, streams


class SplitRows(nn.Module):
    """y = x·Wᵀ (+ b) with W's rows in parts, each part's product on its own CPU stream."""

    def __init__(self, whole: nn.Module, streams: list[mx.Stream], runner: Runner) -> None:
        super().__init__()
        self.whole = whole
        rows = whole.weight.shape[0]
        count = max(1, min(len(streams), rows // MIN_ROWS))
        edges = [rows * i // count for i in range(count + 1)]
        parts = []
        for start, end in zip(edges, edges[1:]):
            part = copy.copy(whole)
            for name in ROW_ARRAYS:
                if name in whole:
                    part[name] = whole[name][start:end]
            parts.append(part)
        self.split = _Parts(parts, streams[:count])
        self.runner = runner

    @property
    def weight(self) -> mx.array:
        """The whole weight (a custom kernel at the lm_head seam reads it)."""
        return self.whole.weight

    def __call__(self, x: mx.array) -> mx.array:
        counting.ran(self.runner, "cpu_streams")
        outs = [_on(stream, part, x) for part, stream in zip(self.split.parts, self.split.streams)]
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)


def _on(stream: mx.Stream, module: nn.Module, x: mx.array) -> mx.array:
    with mx.stream(stream):
        return module(x)


def cpu_streams(runner: Runner, value: str | None = None) -> None:
    """fast-path: every Linear and QuantizedLinear of the model (the layers' projections, packed or not, and the
    output head) computed in row parts on one CPU stream per core; the parts' arrays are views of the whole's rows."""
    streams = [mx.default_stream(mx.cpu)] + [mx.new_stream(mx.cpu) for _ in range(cores() - 1)]
    split = [(name, SplitRows(module, streams, runner)) for name, module in runner.model.named_modules()
             if isinstance(module, (nn.Linear, QuantizedLinear)) and not isinstance(module, QuantizedEmbedding)]
    runner.model.update_modules(tree_unflatten(split))
