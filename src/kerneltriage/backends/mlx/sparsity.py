"""How much of the attention weight is ~0 on MLX: the ceiling for sparse-V (skip V rows nobody attends to).

The torch backend's method on MLX arrays: during one prefill of a real passage with real weights, each layer's
softmax(q·kᵀ/√D) is recomputed for the last query rows, the ones that see the deepest context, and the weights
below a threshold counted among the keys each query may see, on the same passage (`engine/passage.py`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import mlx.core as mx

from kerneltriage.backends.mlx.cache import Positions
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.passage import PASSAGE
from kerneltriage.engine.probes import Sparsity

SPARSE_THRESHOLD = 1e-6
QUERY_ROWS = 16  # the last prompt positions: the queries with the most keys to skip


def _below(q: mx.array, k: mx.array, start: int, threshold: float) -> tuple[int, int]:
    """(weights below threshold, weights counted) for the last QUERY_ROWS queries of q (B, H, T, D)."""
    rows = min(QUERY_ROWS, q.shape[2])
    groups = q.shape[1] // k.shape[1]
    keys = mx.repeat(k.astype(mx.float32), groups, axis=1)  # (B, H, S, D)
    scores = q[:, :, -rows:].astype(mx.float32) @ keys.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, rows, S)
    positions = mx.arange(start + q.shape[2] - rows, start + q.shape[2])  # (rows,)
    visible = mx.arange(k.shape[2])[None, :] <= positions[:, None]  # (rows, S)
    weights = mx.softmax(mx.where(visible, scores, float("-inf")), axis=-1)
    small = (weights < threshold) & visible
    return int(small.sum().item()), int(visible.sum().item()) * q.shape[0] * q.shape[1]


def attention_sparsity(runner: Runner, tokens: Sequence[int], threshold: float = SPARSE_THRESHOLD) -> Sparsity:
    """Prefill `tokens` with each layer's attention weights inspected on the way."""
    model, inner = runner.model, runner.model.attention
    counts: list[tuple[int, int]] = []

    def inspecting(q: mx.array, k: mx.array, v: mx.array, pos: Positions, **kwargs: Any) -> mx.array:
        counts.append(_below(q, k, pos.start or 0, threshold))
        return inner(q, k, v, pos, **kwargs)

    runner.reset_cache(len(tokens))
    model.attention = inspecting
    try:
        mx.eval(runner.prefill(tokens, 0))
    finally:
        model.attention = inner
    small, total = (sum(column) for column in zip(*counts))
    return Sparsity(len(tokens), threshold, small / total, tuple(s / t for s, t in counts))


def passage_tokens(runner: Runner) -> list[int]:
    """The passage in the model's own tokens, cut to fit its context."""
    return runner.checkpoint.tokenizer.encode(PASSAGE)[: runner.config.max_context]
