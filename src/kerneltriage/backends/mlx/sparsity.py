"""How much of the attention weight is ~0 (engine/sparsity.py has the method): the count over MLX arrays."""

from __future__ import annotations

import math
from typing import Sequence

import mlx.core as mx

from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine import sparsity
from kerneltriage.engine.probes import Sparsity
from kerneltriage.engine.sparsity import QUERY_ROWS, SPARSE_THRESHOLD


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
    """Prefill `tokens` with each layer's attention weights inspected on the way (engine/sparsity.py)."""
    return sparsity.attention_sparsity(runner, tokens, _below, threshold)
