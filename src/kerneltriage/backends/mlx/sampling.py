"""Sampling on the device: no host sync inside (the token stays an array until the caller reads it), the logits
processors of one generation, and speculative acceptance through the same processors.

MLX is lazy: a sampled token is scheduled at once (`mx.async_eval`), as a CUDA launch would be queued, and with it
the decode step under it (the runner leaves a step's graph to its token: one evaluation a token), so the token loops
order the work on MLX as they do on torch (`one_sync` queues step n+1 before token n is read).
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from kerneltriage.backends.mlx.acceptance import Key, greedy_accept, rejection_accept, sample_probs
from kerneltriage.engine.sampling import LogitsProcessor, ProcessedSampler, SamplingParams
from kerneltriage.engine.speculative.draft import Draft

REPETITION_CONTEXT = 20  # tokens the repetition penalty looks back over (mlx-lm's default)
NEG_INF = float("-inf")


def filter_logits(logits: mx.array, params: SamplingParams) -> mx.array:
    """Apply temperature, then top-k, top-p and min-p by setting excluded logits to -inf. (B, V) → (B, V)."""
    logits = logits.astype(mx.float32) / params.temperature
    if params.top_k:
        kth = mx.topk(logits, min(params.top_k, logits.shape[-1]), axis=-1).min(axis=-1, keepdims=True)
        logits = mx.where(logits < kth, NEG_INF, logits)
    if params.min_p:
        # keep tokens whose probability is at least min_p × the top probability
        probs = mx.softmax(logits, axis=-1)
        logits = mx.where(probs < params.min_p * probs.max(axis=-1, keepdims=True), NEG_INF, logits)
    if params.top_p < 1:
        order = mx.argsort(-logits, axis=-1)
        sorted_probs = mx.softmax(mx.take_along_axis(logits, order, axis=-1), axis=-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (mx.cumsum(sorted_probs, axis=-1) - sorted_probs) >= params.top_p
        drop = mx.put_along_axis(mx.zeros_like(drop_sorted), order, drop_sorted, axis=-1)
        logits = mx.where(drop, NEG_INF, logits)
    return logits


def sample(logits: mx.array, params: SamplingParams, key: Key = None) -> mx.array:
    """Next token ids (B,) from logits (B, V), on the device."""
    if params.greedy:
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    return mx.random.categorical(filter_logits(logits, params), axis=-1, key=key).astype(mx.int32)


def repetition_penalty(penalty: float) -> LogitsProcessor:
    """mlx-lm's repetition penalty as a logits processor: the logits of the last REPETITION_CONTEXT tokens are
    divided by `penalty` when positive and multiplied by it when negative (both lower their probability)."""

    def process(tokens: mx.array, logits: mx.array) -> mx.array:
        seen = tokens[-REPETITION_CONTEXT:]
        picked = logits[:, seen]  # (1, N)
        out = mx.array(logits)  # a new array: the caller's logits stay as they were
        out[:, seen] = mx.where(picked < 0, picked * penalty, picked / penalty)
        return out

    return process


def draft_token(logits: mx.array, sampler: "MlxSampler", probs: list[mx.array]) -> mx.array:
    """A drafted token (1, 1) from a draft's logits (1, V): the argmax when greedy, else drawn from
    q = softmax(filter(logits)), q appended to `probs` for the acceptance test."""
    if sampler.params.greedy:
        return mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32)
    probs.append(mx.softmax(filter_logits(logits, sampler.params), axis=-1))
    return sample_probs(probs[-1], sampler.next_key()).astype(mx.int32).reshape(1, 1)


class MlxSampler(ProcessedSampler):
    """The sampler of one generation: its logits processors over the token history (kept on the device), its
    parameters and PRNG key; every token it emits joins the history."""

    def __init__(self, params: SamplingParams, prompt: list[int], processors: Sequence[LogitsProcessor] = ()) -> None:
        super().__init__(params, prompt, processors, repetition_penalty)
        self.key = None if params.seed is None else mx.random.key(params.seed)
        self.history = mx.array(prompt, dtype=mx.int32)  # (N,)

    def next_key(self) -> Key:
        """A fresh key from this generation's seed (None: MLX's global generator)."""
        if self.key is None:
            return None
        self.key, key = mx.random.split(self.key)
        return key

    def __call__(self, logits: mx.array) -> mx.array:
        if self.processors:
            logits = self.process(self.history, logits)
        token = sample(logits, self.params, self.next_key())  # (1,)
        if self.processors:
            self.history = mx.concatenate([self.history, token.reshape(1)])
        mx.async_eval(token)  # queued now (module docstring)
        return token

    def accept(self, logits: mx.array, draft: Draft) -> list[int]:
        """Exact acceptance of `draft` over verify logits (k+1, V): row i is processed with the history and the
        first i drafts, as plain decoding would have processed it had it emitted them."""
        drafts = mx.array(draft.tokens).astype(mx.int32)  # (k,)
        if self.processors:
            logits = mx.concatenate([self.process(mx.concatenate([self.history, drafts[:i]]), logits[i:i + 1])
                                     for i in range(logits.shape[0])])
        emitted = greedy_accept(logits, drafts) if self.params.greedy else self._sampled(logits, drafts, draft)
        if self.processors:
            self.history = mx.concatenate([self.history, mx.array(emitted, dtype=mx.int32)])
            for token in emitted:
                self.follow(token)
        return emitted

    def _sampled(self, logits: mx.array, drafts: mx.array, draft: Draft) -> list[int]:
        p = mx.softmax(filter_logits(logits, self.params), axis=-1)  # (k+1, V)
        q = draft.probs
        if q is None:  # a deterministic draft (ngram): q is one-hot on the drafted token
            q = (mx.arange(p.shape[-1])[None, :] == drafts[:, None]).astype(p.dtype)
        n, token = rejection_accept(p[None], q[None], drafts[None], (self.next_key(), self.next_key()))
        packed = mx.concatenate([n, drafts, token.astype(mx.int32)]).tolist()  # one host sync
        return packed[1:packed[0] + 1] + packed[-1:]


__all__ = ["MlxSampler", "draft_token", "filter_logits", "sample", "sample_probs", "repetition_penalty"]
