"""The attention lever on MLX: `sdpa_unfused`, attention as its composed ops (matmul → softmax → matmul) instead
of `mx.fast.scaled_dot_product_attention`. On Metal and CUDA it measures what the fused kernel is worth where its
gate takes the shape (`gates.py`); on the CPU, where MLX has no fused attention, it races MLX's own fallback.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.models.llama import SDPA, SdpaFn
from kerneltriage.backends.mlx.runner import Runner


def unfused_sdpa(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask: Any = None) -> mx.array:
    """softmax(q·kᵀ·scale + mask)·v with grouped KV heads, in the inputs' dtype (softmax in float32).
    q (B, H, T, D), k and v (B, Hkv, S, D), mask None, "causal" or (T, S) bool → (B, H, T, D)."""
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    # (B, H, T, D) → (B, Hkv, G, T, D): query head j*G+i belongs to KV head j
    grouped = (q * scale).reshape(batch, kv_heads, heads // kv_heads, length, dim)
    scores = grouped @ k[:, :, None].swapaxes(-1, -2)  # (B, Hkv, G, T, S)
    if isinstance(mask, str):  # "causal": query i sees keys ≤ i + (S − T)
        mask = mx.arange(keys)[None, :] <= mx.arange(length)[:, None] + (keys - length)
    if mask is not None:
        scores = mx.where(mask, scores, float("-inf"))
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ v[:, :, None]).reshape(batch, heads, length, dim)  # (B, Hkv, G, T, D) → (B, H, T, D)


def sdpa_unfused(runner: Runner) -> None:
    """fast-path (for comparison): every attention call through `unfused_sdpa`, counted per call."""
    inner = runner.model.attention

    def counted(*args: Any, **kwargs: Any) -> mx.array:
        counting.ran(runner, "sdpa_unfused")
        return unfused_sdpa(*args, **kwargs)

    def attention(q: mx.array, k: mx.array, v: mx.array, pos: Any, sdpa: SdpaFn = SDPA) -> mx.array:
        return inner(q, k, v, pos, sdpa=counted)

    runner.model.attention = attention
