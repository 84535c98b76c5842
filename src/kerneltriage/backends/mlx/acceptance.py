"""The two exact acceptance rules of speculative decoding on MLX, the maths beside the code (as in the torch
backend's `acceptance.py`, whose exactness argument this follows line for line)."""

from __future__ import annotations

import mlx.core as mx

Key = mx.array | None  # a PRNG key, or None for MLX's global generator


def sample_probs(probs: mx.array, key: Key) -> mx.array:
    """Token ids (...,) drawn from unnormalized probabilities (..., V): a categorical draw on log p, no host sync."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


def greedy_accept(logits: mx.array, drafts: mx.array) -> list[int]:
    """Exact greedy: keep drafts while they equal the target's argmax, then emit the target's own argmax.

    logits (k+1, V): row i is the target's prediction after [last, d1..di]. The kept drafts equal the
    argmaxes, so the emitted tokens are argmax rows 0..n: token for token what plain greedy decode emits."""
    best = mx.argmax(logits, axis=-1).astype(mx.int32)  # (k+1,)
    kept = mx.cumprod((best[:-1] == drafts).astype(mx.int32)).sum()  # length of the agreeing prefix
    packed = mx.concatenate([kept.reshape(1), best]).tolist()  # one host sync
    return packed[1:packed[0] + 2]


def rejection_accept(p: mx.array, q: mx.array, drafts: mx.array, keys: tuple[Key, Key]
                     ) -> tuple[mx.array, mx.array]:
    """Leviathan et al. 2023 / Chen et al. 2023 speculative sampling over a batch of independent trials.

    p (B, k+1, V) target probabilities, q (B, k, V) the draft's, drafts (B, k) with d_i ~ q_i. Returns
    (accepted count n (B,), next token (B,)); the emitted tokens are d_1..d_n then `next`, distributed
    exactly as sampling each from p (Leviathan et al., Theorem 1)."""
    rows = mx.arange(p.shape[0])
    # Keep d_i with probability min(1, p_i(d_i) / q_i(d_i)), in float32: u < p/q ⇔ u < min(1, p/q) for u in [0, 1).
    p_draft = mx.take_along_axis(p[:, :-1], drafts[..., None], axis=-1)[..., 0].astype(mx.float32)  # (B, k)
    q_draft = mx.take_along_axis(q, drafts[..., None], axis=-1)[..., 0].astype(mx.float32)  # (B, k), > 0
    u = mx.random.uniform(shape=q_draft.shape, key=keys[0])
    n = mx.cumprod((u < p_draft / q_draft).astype(mx.int32), axis=-1).sum(-1)  # (B,) the accepted prefix
    # At the first rejection (n < k) draw from the residual (p_n − q_n)+; normalizing is implied (the draw is
    # scale-invariant). Exactness: P(emit x) = q(x)·min(1, p(x)/q(x)) + P(reject)·(p(x) − q(x))+ / Σ(p − q)+
    # = min(p, q)(x) + (p − q)+(x) = p(x), because P(reject) = 1 − Σ min(p, q) = Σ (p − q)+.
    # When all k are kept (n = k), the zero row appended to q makes the residual p_k itself: the bonus token.
    q_padded = mx.concatenate([q, mx.zeros_like(q[:, :1])], axis=1)  # (B, k+1, V)
    residual = mx.maximum(p - q_padded, 0)[rows, n]  # (B, V)
    # Rounding can empty a residual whose exact mass is tiny: fall back to p_n there.
    residual = mx.where(residual.sum(-1, keepdims=True) > 0, residual, p[rows, n])
    return n, sample_probs(residual, keys[1])
