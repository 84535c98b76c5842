"""Sampling on the device: no host sync inside (the token stays a tensor until the caller reads it)."""

from __future__ import annotations

import torch

from kerneltriage.engine.sampling import SamplingParams


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, then top-k, top-p and min-p by setting excluded logits to -inf. (B, V) → (B, V)."""
    logits = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.min_p:
        # keep tokens whose probability is at least min_p × the top probability
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V), on the logits' device."""
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, params).softmax(-1)
    # Gumbel-style trick: argmax(p / Exp(1)) samples from p without torch.multinomial's host sync.
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)
