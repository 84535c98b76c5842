"""delete, approximate: decode attention that skips the V rows every query head of their KV head weights below a
threshold (sparse-V). The split design, in plain torch ops (CPU and CUDA):

  scores = q·Kᵀ/√D (every key is still read: the weights are what decide), softmax in float32,
  keep row s of KV head j when any of j's G query heads gives it weight ≥ threshold,
  per KV head, gather its kept V rows only and out = (G, n) kept weights @ (n, D) kept rows (one small GEMM).

Dropped rows are not renormalised away: their weights (each < threshold, S·threshold in all at most) are simply
missing from the sum, so the error in each output is at most S·threshold·max|v|. The gather's size depends on the
weights (a host sync on CUDA), so no CUDA graph can capture it (the lever table refuses `graphs` beside it; the fused
kernel `kernel=kerneltriage.kernels.sparse_v_attention:SPARSE_V` keeps the skip inside one launch instead).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.models.llama import SDPA, SdpaFn
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine.sparsity import SPARSE_THRESHOLD

THRESHOLD = SPARSE_THRESHOLD  # the weight below which a V row is skipped (the one Q1's probe counts)


def sparse_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  threshold: float = SPARSE_THRESHOLD) -> tuple[torch.Tensor, int]:
    """One query row per head: q (B, H, 1, D), k and v (B, Hkv, S, D), mask (1, S) bool or None → the output
    (B, H, 1, D) and how many V rows (over every KV head) were read."""
    batch, heads, _, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    folded = q.reshape(batch * kv_heads, groups, dim)  # (B·Hkv, G, D): query head j·G + i → KV head j
    keys, values = k.flatten(0, 1), v.flatten(0, 1)  # (B·Hkv, S, D)
    # in float32, as a fused kernel accumulates: bf16 scores of ~10 would move each weight by ~4%
    scores = (folded.float() @ keys.float().transpose(1, 2)) / math.sqrt(dim)  # (B·Hkv, G, S)
    if mask is not None:
        scores = scores.masked_fill(~mask[-1], float("-inf"))
    weights = scores.softmax(-1)
    keep = (weights >= threshold).any(1)  # (B·Hkv, S): the V rows some query head of the group needs
    counts = keep.sum(-1).tolist()  # the host learns each head's kept rows: the sync no graph can capture
    rows = keep.nonzero(as_tuple=True)[1].split(counts)  # per KV head, its kept rows in order
    # per KV head: (G, n) weights of the kept rows @ (n, D) those rows of V, the only V rows read
    out = torch.stack([weights[h][:, kept] @ values[h][kept].float() for h, kept in enumerate(rows)])  # (B·Hkv, G, D)
    return out.reshape(batch, heads, 1, dim).to(q.dtype), sum(counts)


def sparse_v(runner: Runner, value: str | None = None) -> None:
    """delete, approximate: decode steps' attention skips the V rows whose weights are all below THRESHOLD
    (prefill and multi-row verifies keep the stock path). Counts its runs, and the V rows read and skipped."""
    inner = runner.model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any, sdpa: SdpaFn = SDPA) -> torch.Tensor:
        if q.shape[2] != 1 or (pos.mask is None and pos.start == 0):
            return inner(q, k, v, pos, sdpa=sdpa)
        counting.ran(runner, "sparse_v")
        out, read = sparse_decode(q, k, v, pos.mask, THRESHOLD)
        visible = k.shape[0] * k.shape[1] * (k.shape[2] if pos.mask is None else int(pos.mask[-1].sum()))
        runner.counters["sparse_v.rows_read"] += read
        runner.counters["sparse_v.rows_skipped"] += visible - read
        return out

    runner.model.attention = attention
