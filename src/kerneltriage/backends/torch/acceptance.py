"""The two exact acceptance rules of speculative decoding, on the device, with the maths beside the code."""

from __future__ import annotations

from typing import Sequence

import torch

Generator = torch.Generator | None


def sample_probs(probs: torch.Tensor, generator: Generator) -> torch.Tensor:
    """Token ids (...,) drawn from unnormalized probabilities (..., V): argmax(p / Exp(1)), no host sync."""
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


def greedy_accept(logits: torch.Tensor, drafts: Sequence[int] | torch.Tensor) -> list[int]:
    """Exact greedy: keep drafts while they equal the target's argmax, then emit the target's own argmax.

    logits (k+1, V): row i is the target's prediction after [last, d1..di]. The kept drafts equal the
    argmaxes, so the emitted tokens are argmax rows 0..n: token for token what plain greedy decode emits.
    One host sync: the comparison is the host's (drafts on the device come back with the argmaxes)."""
    if len(logits) != len(drafts) + 1:
        raise ValueError(f"greedy acceptance: {len(logits)} logit rows for {len(drafts)} drafts; expected drafts + 1")
    best = logits.argmax(dim=-1)  # (k+1,)
    if isinstance(drafts, torch.Tensor):
        both = torch.cat([best, drafts.view(-1)]).tolist()  # one host sync
        best, drafts = both[:len(logits)], both[len(logits):]
    else:
        best = best.tolist()  # one host sync
    kept = next((i for i, (b, d) in enumerate(zip(best, drafts)) if b != d), len(drafts))
    return best[:kept + 1]


def rejection_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     generator: Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan et al. 2023 / Chen et al. 2023 speculative sampling over a batch of independent trials.

    p (B, k+1, V) target probabilities, q (B, k, V) the draft's, drafts (B, k) with d_i ~ q_i. Returns
    (accepted count n (B,), next token (B,)); the emitted tokens are d_1..d_n then `next`, distributed
    exactly as sampling each from p (Leviathan et al., Theorem 1)."""
    rows = torch.arange(p.shape[0], device=p.device)
    # Keep d_i with probability min(1, p_i(d_i) / q_i(d_i)), in float32: u < p/q ⇔ u < min(1, p/q) for u in [0, 1).
    p_draft = p[:, :-1].gather(-1, drafts.unsqueeze(-1)).squeeze(-1).float()  # (B, k)
    q_draft = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).float()  # (B, k), > 0: d_i was drawn from q_i
    u = torch.rand(q_draft.shape, generator=generator, device=p.device)
    n = (u < p_draft / q_draft).int().cumprod(-1).sum(-1)  # (B,) the accepted prefix
    # At the first rejection (n < k) draw from the residual (p_n − q_n)+; normalizing is implied (the draw is
    # scale-invariant). Exactness: P(emit x) = q(x)·min(1, p(x)/q(x)) + P(reject)·(p(x) − q(x))+ / Σ(p − q)+
    # = min(p, q)(x) + (p − q)+(x) = p(x), because P(reject) = 1 − Σ min(p, q) = Σ (p − q)+.
    # When all k are kept (n = k), the zero row appended to q makes the residual p_k itself: the bonus token.
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # (B, k+1, V)
    residual = (p - q_padded).clamp_min(0)[rows, n]  # (B, V)
    # Rounding can empty a residual whose exact mass is tiny: fall back to p_n there.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, n])
    return n, sample_probs(residual, generator)
