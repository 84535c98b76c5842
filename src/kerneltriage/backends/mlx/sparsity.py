"""How much of the attention weight is ~0 (engine/sparsity.py has the method): the count over MLX arrays."""

from __future__ import annotations

import math
from typing import Sequence

import mlx.core as mx

from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine import sparsity
from kerneltriage.engine.probes import Sparsity
from kerneltriage.engine.sparsity import QUERY_ROWS, SPARSE_THRESHOLD


def _below(q: mx.array, k: mx.array, start: int, threshold: float) -> tuple[int, int, int, int]:
    """(weights below threshold, weights counted, V rows below it for the whole group, V rows counted) for the last
    QUERY_ROWS queries of q (B, H, T, D)."""
    rows = min(QUERY_ROWS, q.shape[2])
    groups = q.shape[1] // k.shape[1]
    keys = mx.repeat(k.astype(mx.float32), groups, axis=1)  # (B, H, S, D)
    scores = q[:, :, -rows:].astype(mx.float32) @ keys.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, rows, S)
    positions = mx.arange(start + q.shape[2] - rows, start + q.shape[2])  # (rows,)
    visible = mx.arange(k.shape[2])[None, :] <= positions[:, None]  # (rows, S)
    weights = mx.softmax(mx.where(visible, scores, float("-inf")), axis=-1)
    small = (weights < threshold) & visible
    batch, kv_heads, seen = k.shape[0], k.shape[1], int(visible.sum().item())
    # (B, Hkv, G, rows, S) → a V row is skippable when every query head of its KV head leaves it below
    grouped = mx.all(small.reshape(batch, kv_heads, groups, rows, k.shape[2]), axis=2)
    return int(small.sum().item()), seen * batch * q.shape[1], int(grouped.sum().item()), seen * batch * kv_heads


def attention_sparsity(runner: Runner, tokens: Sequence[int], threshold: float = SPARSE_THRESHOLD) -> Sparsity:
    """Prefill `tokens` with each layer's attention weights inspected on the way (engine/sparsity.py)."""
    return sparsity.attention_sparsity(runner, tokens, _below, threshold)
