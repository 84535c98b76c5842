"""delete: under a constraint, a decode step whose allowed tokens are few computes only their logits — the allowed
rows of the output projection gathered and one small GEMV, the rest -inf — instead of all V rows and then a mask.

    full:    logits = W h               W (V, H): V·H weights read
    compact: logits[r] = W[r] h  (r ∈ R), -inf elsewhere: |R|·H read, |R|·H written and read again (the gather)

so it pays while |R| stays under a crossover (CROSSOVER, measured per device type: docs/constrained.md), and the step
falls back to the full projection above it (the constraint's mask then does the rest). Greedy picks the same token:
an allowed row's logit is the same dot product either way (only its summation order may differ), and a disallowed
row is -inf on both paths.

Under `graphs` the step's body (everything up to the final norm) is replayed from its own graphs and the compact head
from one more, captured over a fixed-size row buffer of CROSSOVER rows (the allowed ids, padded by repeating the first:
a repeated row writes the same value twice); a step above the crossover replays the full graphed step. The gather
writes into a buffer of CROSSOVER rows allocated once, graphed or not.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.backends.torch.graphed import Capture, GraphedStep
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.runner import Runner

LEVER = "vocab_compact"
# the allowed share of the vocabulary up to which the compact head is faster than the full projection and the mask,
# by device type: a compact row costs about three full rows (gather: read and write, then the GEMV reads it again),
# so the crossover sits near V/3; CPU measured on the 2-core machine with the 49k vocabulary (docs/constrained.md),
# CUDA provisional until the H200 sweep (benchmarks/tools/vocab_crossover.py) measures it
CROSSOVER = {"cpu": 1 / 3, "cuda": 0.25}


def hidden_one(model: Model, token: torch.Tensor, start: int) -> torch.Tensor:
    """The decode step up to the output projection: the final-normed hidden state (1, H) of token (1, 1)."""
    return model.hidden(token, start)[:, -1]


class CompactHead:
    """Logits (1, V) from a hidden state (1, H) for the given rows only, -inf elsewhere. Eager, or (`capture_fn`)
    replayed from one graph over a fixed buffer of `limit` rows."""

    def __init__(self, runner: Runner, limit: int, capture_fn: Capture | None = None) -> None:
        self.runner, self.limit, self.capture = runner, limit, capture_fn
        self.weight = runner.model.lm_head.weight  # (V, H)
        self.graph: Any = None
        self.rows = torch.zeros(limit, dtype=torch.long, device=runner.device)  # the graph's row buffer
        # the gathered rows land in one buffer allocated once: a fresh (K, H) tensor per step cost page faults (a
        # 38 MB gather took 4.3 µs a row on the CPU, 1.7 below 28 MB)
        self.picked = torch.empty((limit, self.weight.shape[1]), dtype=self.weight.dtype, device=runner.device)
        self.hidden = torch.zeros((1, self.weight.shape[1]), dtype=self.weight.dtype, device=runner.device)
        self.out: torch.Tensor | None = None

    def compute(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        counting.ran(self.runner, LEVER)
        picked = torch.index_select(self.weight, 0, rows, out=self.picked[: len(rows)])  # (K, H)
        values = F.linear(hidden, picked)  # (1, K)
        logits = torch.full((1, self.weight.shape[0]), float("-inf"), dtype=values.dtype, device=values.device)
        return logits.index_copy_(1, rows, values)  # (1, V)

    def __call__(self, hidden: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        ids = torch.as_tensor(rows, dtype=torch.long)
        if self.capture is None:
            return self.compute(hidden, ids.to(self.rows.device))
        padded = torch.cat([ids, ids[:1].expand(self.limit - len(ids))])  # repeats write the same value
        self.rows.copy_(padded)
        self.hidden.copy_(hidden)
        if self.graph is None:
            before = self.runner.counters[LEVER]
            self.graph, self.out = self.capture(lambda: self.compute(self.hidden, self.rows), 2)
            self.runner.counters[LEVER] = before  # capture is not execution: replays count
        self.graph.replay()
        self.runner.counters[LEVER] += 1
        return self.out


class CompactStep:
    """The decode step with allowed rows: the body (eager, or its own graphs under `graphs`), then the compact head."""

    def __init__(self, runner: Runner, limit: int, capture_fn: Capture = capture) -> None:
        graphed = isinstance(runner.decode_step, GraphedStep)
        self.body = GraphedStep(runner, hidden_one, runner.decode_step.window_step, capture_fn, lever="graphs") \
            if graphed else hidden_one
        self.head = CompactHead(runner, limit, capture_fn if graphed else None)

    def __call__(self, model: Model, token: torch.Tensor, start: int, rows: Sequence[int]) -> torch.Tensor:
        return self.head(self.body(model, token, start), rows)


def vocab_compact(runner: Runner, value: str | None = None, capture_fn: Capture = capture) -> None:
    """delete: decode steps whose allowed tokens are at most CROSSOVER of the vocabulary compute only those rows of the
    output projection."""
    if runner.model.lm_head.weight.shape[0] != runner.config.vocab_size:
        raise RuntimeError(f"{LEVER}: the output projection is not (vocab, hidden)")
    runner.compact_limit = max(1, int(CROSSOVER[runner.device.type] * runner.config.vocab_size))
    runner.compact_step = CompactStep(runner, runner.compact_limit, capture_fn)
