"""delete: under a constraint, a decode step whose allowed tokens are few computes only their logits — the allowed
rows of the output projection taken and one small matmul, the rest -inf — instead of all V rows and then a mask
(backends/torch/vocab_compact.py has the arithmetic and the crossover's reasoning; this is its MLX twin, eager)."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.runner import Runner

LEVER = "vocab_compact"
# the allowed share of the vocabulary up to which the compact head pays, by device type: provisional on MLX (torch's
# CPU figure, measured: docs/constrained.md), until benchmarks/tools/vocab_crossover.py has an MLX lane
CROSSOVER = {"cpu": 1 / 3, "metal": 0.25, "cuda": 0.25}


class CompactStep:
    """The decode step with allowed rows: the model up to its final norm, then those rows of the projection."""

    def __init__(self, runner: Runner) -> None:
        self.runner, self.vocab = runner, runner.config.vocab_size

    def __call__(self, model: Model, token: mx.array, start: int, rows: Sequence[int]) -> mx.array:
        counting.ran(self.runner, LEVER)
        hidden = model.hidden(token, start)[:, -1]  # (1, H)
        ids = mx.array(rows, dtype=mx.int32)  # (K,)
        values = hidden @ mx.take(model.lm_head.weight, ids, axis=0).T  # (1, K)
        logits = mx.full((1, self.vocab), float("-inf"), dtype=values.dtype)
        logits[:, ids] = values
        return logits  # (1, V)


def vocab_compact(runner: Runner, value: str | None = None) -> None:
    """delete: decode steps whose allowed tokens are at most CROSSOVER of the vocabulary compute only those rows."""
    runner.compact_limit = max(1, int(CROSSOVER[runner.device_type] * runner.config.vocab_size))
    runner.compact_step = CompactStep(runner)
