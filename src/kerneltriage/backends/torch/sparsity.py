"""How much of the attention weight is ~0 (engine/sparsity.py has the method): the count over torch tensors."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine import sparsity
from kerneltriage.engine.probes import Sparsity
from kerneltriage.engine.sparsity import QUERY_ROWS, SPARSE_THRESHOLD


def _below(q: torch.Tensor, k: torch.Tensor, start: int, threshold: float) -> tuple[int, int, int, int]:
    """(weights below threshold, weights counted, V rows below it for the whole group, V rows counted) for the last
    QUERY_ROWS queries of q (B, H, T, D)."""
    rows = min(QUERY_ROWS, q.shape[2])
    groups = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(groups, dim=1)  # (B, H, S, D)
    scores = q[:, :, -rows:].float() @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, rows, S)
    positions = torch.arange(start + q.shape[2] - rows, start + q.shape[2], device=q.device)  # (rows,)
    visible = torch.arange(k.shape[2], device=q.device).unsqueeze(0) <= positions.unsqueeze(1)  # (rows, S)
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    small = (weights < threshold) & visible
    batch, kv_heads = k.shape[0], k.shape[1]
    # (B, Hkv, G, rows, S) → a V row is skippable when every query head of its KV head leaves it below
    grouped = small.reshape(batch, kv_heads, groups, rows, k.shape[2]).all(2)
    return (int(small.sum()), int(visible.sum()) * batch * q.shape[1], int(grouped.sum()),
            int(visible.sum()) * batch * kv_heads)


@torch.inference_mode()
def attention_sparsity(runner: Runner, tokens: Sequence[int], threshold: float = SPARSE_THRESHOLD) -> Sparsity:
    """Prefill `tokens` with each layer's attention weights inspected on the way (engine/sparsity.py)."""
    return sparsity.attention_sparsity(runner, tokens, _below, threshold)
