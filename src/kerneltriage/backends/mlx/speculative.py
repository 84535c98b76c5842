"""Speculative decoding on an MLX runner: the model drafters (the target's own first layers, a draft model) and
its installation, as in the torch backend. The loop, prompt lookup and the depth controller are backend-neutral
(engine/speculative/); acceptance is in `sampling.py`, the verify forward on the runner.
"""

from __future__ import annotations

import mlx.core as mx

from kerneltriage.backends.mlx.cache import KVCache
from kerneltriage.backends.mlx.load import build_runner
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.backends.mlx.sampling import MlxSampler, draft_token
from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative import drafters
from kerneltriage.engine.speculative.config import Speculation
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.draft import Draft, Drafter
from kerneltriage.engine.speculative.drafters import ModelDrafter
from kerneltriage.engine.speculative.selfdraft import SelfDrafter, draft_steps


def draft_tokens(model: Model, feed: list[int], start: int, k: int, sampler: MlxSampler) -> Draft:
    """Run a draft model over `feed` (the context it has not seen) at `start`, then k-1 single steps: k tokens,
    argmax when greedy, else drawn from q = softmax(filter(logits)), q kept for the acceptance test."""
    probs: list[mx.array] = []
    step = mx.array([feed], dtype=mx.int32)  # (1, F)
    tokens = draft_steps(model, step, start, k, lambda logits: draft_token(logits, sampler, probs))
    draft = Draft(mx.concatenate(tokens).reshape(-1), mx.concatenate(probs) if probs else None)
    mx.async_eval(draft.tokens, *([draft.probs] if probs else []))  # queued now: the decoder times the draft apart
    return draft


class _LayerPrefixCache(KVCache):
    """The first L layers of another cache, sharing its lists: what the draft writes, the target's cache holds."""

    def __init__(self, cache: KVCache, layers: int) -> None:  # no super().__init__: the storage is borrowed
        self.keys, self.values = cache.keys, cache.values  # the same lists: the draft's writes land in them
        self.max_len, self.length = cache.max_len, 0


def self_drafter(target: Model, layers: int) -> SelfDrafter:
    """The target's first `layers` layers as a drafter (engine/speculative/selfdraft.py)."""
    return SelfDrafter(target, layers, type(target), _LayerPrefixCache, draft_tokens)


def model_drafter(runner: Runner) -> ModelDrafter:
    """A draft model's runner as a drafter (engine/speculative/drafters.py)."""
    return ModelDrafter(runner, draft_tokens)


def build_drafter(speculation: Speculation, runner: Runner) -> Drafter:
    """The drafter `speculation` names for this target (drafters.build_drafter)."""
    return drafters.build_drafter(
        speculation, runner, lambda layers: self_drafter(runner.model, layers),
        lambda checkpoint: model_drafter(build_runner(checkpoint, runner.device, runner.dtype)))


def install_speculation(runner: Runner, speculation: Speculation, drafter: Drafter | None = None
                        ) -> SpeculativeDecoder:
    """Put speculative decoding on `runner` (after its levers: the verify steps they installed are used)."""
    if speculation.tree:
        raise InputError(f"--spec {speculation.source_text}: the MLX backend has no token-tree verify yet "
                         "(torch only); use suffix[:N]")
    return drafters.install(runner, speculation, drafter or build_drafter(speculation, runner))
