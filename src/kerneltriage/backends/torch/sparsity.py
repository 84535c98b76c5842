"""How much of the attention weight is ~0: the ceiling for sparse-V (skip V rows nobody attends to).

Measured on a real prompt with real weights (random weights attend uniformly, so a preset says nothing):
during one prefill, each layer's softmax(q·kᵀ/√D) is recomputed for the last query rows, the ones that see
the deepest context, and the weights below a threshold counted among the keys each query may see.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from kerneltriage.backends.torch.cache import Positions
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine.passage import PASSAGE
from kerneltriage.engine.probes import Sparsity

SPARSE_THRESHOLD = 1e-6
QUERY_ROWS = 16  # the last prompt positions: the queries with the most keys to skip


def _below(q: torch.Tensor, k: torch.Tensor, start: int, threshold: float) -> tuple[int, int]:
    """(weights below threshold, weights counted) for the last QUERY_ROWS queries of q (B, H, T, D)."""
    rows = min(QUERY_ROWS, q.shape[2])
    groups = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(groups, dim=1)  # (B, H, S, D)
    scores = q[:, :, -rows:].float() @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, rows, S)
    positions = torch.arange(start + q.shape[2] - rows, start + q.shape[2], device=q.device)  # (rows,)
    visible = torch.arange(k.shape[2], device=q.device).unsqueeze(0) <= positions.unsqueeze(1)  # (rows, S)
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    small = (weights < threshold) & visible
    return int(small.sum()), int(visible.sum()) * q.shape[0] * q.shape[1]


@torch.inference_mode()
def attention_sparsity(runner: Runner, tokens: Sequence[int], threshold: float = SPARSE_THRESHOLD) -> Sparsity:
    """Prefill `tokens` with each layer's attention weights inspected on the way."""
    model, inner = runner.model, runner.model.attention
    counts: list[tuple[int, int]] = []

    def inspecting(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Positions, **kwargs: object
                   ) -> torch.Tensor:
        counts.append(_below(q, k, pos.start or 0, threshold))
        return inner(q, k, v, pos, **kwargs)

    runner.reset_cache(len(tokens))
    model.attention = inspecting
    try:
        runner.prefill(tokens, 0)
    finally:
        model.attention = inner
    small, total = (sum(column) for column in zip(*counts))
    return Sparsity(len(tokens), threshold, small / total, tuple(s / t for s, t in counts))


def passage_tokens(runner: Runner) -> list[int]:
    """The passage in the model's own tokens, cut to fit its context."""
    return runner.checkpoint.tokenizer.encode(PASSAGE)[: runner.config.max_context]
