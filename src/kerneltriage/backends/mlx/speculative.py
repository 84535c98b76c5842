"""Speculative decoding on an MLX runner: the model drafters (the target's own first layers, a draft model) and
its installation, as in the torch backend. The loop, prompt lookup and the depth controller are backend-neutral
(engine/speculative/); acceptance is in `sampling.py`, the verify forward on the runner.
"""

from __future__ import annotations

import mlx.core as mx

from kerneltriage.backends.mlx.acceptance import sample_probs
from kerneltriage.backends.mlx.cache import KVCache
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.backends.mlx.sampling import MlxSampler, filter_logits
from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative import drafters
from kerneltriage.engine.speculative.config import Speculation
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.draft import Draft, Drafter
from kerneltriage.engine.speculative.drafters import ModelDrafter


def draft_tokens(model: Model, feed: list[int], start: int, k: int, sampler: MlxSampler) -> Draft:
    """Run a draft model over `feed` (the context it has not seen) at `start`, then k-1 single steps: k tokens,
    argmax when greedy, else drawn from q = softmax(filter(logits)), q kept for the acceptance test."""
    tokens, probs = [], []
    step = mx.array([feed], dtype=mx.int32)  # (1, F)
    for _ in range(k):
        logits = model.logits(model.hidden(step, start)[:, -1])  # (1, V)
        start += step.shape[1]
        if sampler.params.greedy:
            step = mx.argmax(logits, axis=-1, keepdims=True).astype(mx.int32)  # (1, 1)
        else:
            probs.append(mx.softmax(filter_logits(logits, sampler.params), axis=-1))
            step = sample_probs(probs[-1], sampler.next_key()).astype(mx.int32).reshape(1, 1)
        tokens.append(step.reshape(1))
    draft = Draft(mx.concatenate(tokens), mx.concatenate(probs) if probs else None)
    mx.async_eval(draft.tokens, *([draft.probs] if probs else []))  # queued now: the decoder times the draft apart
    return draft


class _LayerPrefixCache(KVCache):
    """The first L layers of another cache, sharing its lists: what the draft writes, the target's cache holds."""

    def __init__(self, cache: KVCache, layers: int) -> None:  # no super().__init__: the storage is borrowed
        self.keys, self.values = cache.keys, cache.values  # the same lists: the draft's writes land in them
        self.max_len, self.length = cache.max_len, 0


class SelfDrafter:
    """The target's first L layers, its final norm and lm_head (layer skip), sharing the target's KV cache.

    Sharing is exact: layers < L see the same inputs in both models, so the target's entries are the ones the
    draft would write. The draft writes positions start…start+k-1; the verify forward then rewrites start…start+k
    in every layer, and the target's trim covers both. So the draft resumes at the target's committed length."""

    def __init__(self, target: Model, layers: int) -> None:
        self.model = type(target)(target.config.replace(num_layers=layers))
        self.model.embed_tokens, self.model.norm, self.model.lm_head = target.embed_tokens, target.norm, target.lm_head
        self.model.layers = target.layers[:layers]
        self.model.inv_freq = target.inv_freq
        self.model.attention = target.attention
        self.target, self.layers = target, layers

    def reset(self, runner: Runner, capacity: int) -> None:
        self.model.cache = _LayerPrefixCache(runner.model.cache, self.layers)
        self.model.logits = self.target.logits  # a lever may have replaced the target's output head

    def draft(self, context: list[int], k: int, sampler: MlxSampler) -> Draft:
        committed = len(context) - 1  # the target has cached every token but the last
        self.model.cache.length = committed
        return draft_tokens(self.model, context[committed:], committed, k, sampler)


def model_drafter(runner: Runner) -> ModelDrafter:
    """A draft model's runner as a drafter (engine/speculative/drafters.py)."""
    return ModelDrafter(runner, draft_tokens)


def build_drafter(speculation: Speculation, runner: Runner) -> Drafter:
    """The drafter `speculation` names for this target (drafters.build_drafter)."""
    from kerneltriage.backends.mlx.backend import build_runner

    return drafters.build_drafter(
        speculation, runner, lambda layers: SelfDrafter(runner.model, layers),
        lambda checkpoint: model_drafter(build_runner(checkpoint, runner.device, runner.dtype)))


def install_speculation(runner: Runner, speculation: Speculation, drafter: Drafter | None = None
                        ) -> SpeculativeDecoder:
    """Put speculative decoding on `runner` (after its levers: the verify steps they installed are used)."""
    if speculation.tree:
        raise InputError(f"--spec {speculation.source_text}: the MLX backend has no token-tree verify yet "
                         "(torch only); use suffix[:N]")
    return drafters.install(runner, speculation, drafter or build_drafter(speculation, runner))
