"""A loaded model ready to run: the model, its cache, and the step functions that levers replace."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from kerneltriage.backends.torch.cache import KVCache
from kerneltriage.backends.torch.models.llama import Model
from kerneltriage.backends.torch.sampling import sample
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.sampling import SamplingParams

# (model, tokens (1, T), start) -> logits (1, V) of the last position
StepFn = Callable[[Model, torch.Tensor, int], torch.Tensor]
# (model, tokens (1, T), start) -> logits (T, V) of every position: the speculative verify forward
RowsFn = Callable[[Model, torch.Tensor, int], torch.Tensor]
# (runner, logits (1, V) after the prompt, first position to fill, count, params, generator) -> token ids
LoopFn = Callable[["Runner", torch.Tensor, int, int, SamplingParams, "torch.Generator | None"], Iterator[int]]


def prefill(model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """The stock prefill: logits for every prompt position, the last one kept."""
    return model(tokens, start)[:, -1]


def decode_one(model: Model, token: torch.Tensor, start: int) -> torch.Tensor:
    """One decode step for token (1, 1) at position `start`."""
    return model(token, start)[:, -1]


def verify_rows(model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """One forward over tokens (1, T) at positions start…start+T-1: logits for every row (T, V)."""
    return model(tokens, start)[0]


def decode_loop(runner: "Runner", logits: torch.Tensor, start: int, count: int, params: SamplingParams,
                generator: torch.Generator | None) -> Iterator[int]:
    """The stock token loop: sample on the device, read the token (one sync), decode it, repeat."""
    for position in range(start, start + count):
        token = sample(logits, params, generator)  # (1,)
        yield int(token.item())
        if position + 1 < start + count:
            logits = runner.decode(runner.model, token.view(1, 1), position)


@dataclass
class Runner:
    model: Model
    checkpoint: Checkpoint
    device: torch.device
    dtype: torch.dtype
    prefill: StepFn = prefill
    decode: StepFn = decode_one
    verify: RowsFn = verify_rows
    decode_loop: LoopFn = decode_loop
    cache_type: type[KVCache] = KVCache
    cache_slack: int = 0  # extra slots past the last position (a padded speculative verify writes beyond it)
    levers: tuple[str, ...] = field(default_factory=tuple)
    # Proof of execution: every lever's replacement code counts its own runs here.
    counters: Counter = field(default_factory=Counter)

    @property
    def config(self):  # noqa: ANN201 - ModelConfig, re-exported for callers
        return self.checkpoint.config

    def reset_cache(self, needed: int, batch: int = 1) -> KVCache:
        """A cache with room for `needed` positions (+ the slack); reused (and emptied) when big enough."""
        needed = min(needed + self.cache_slack, max(needed, self.config.max_context))
        cache = self.model.cache
        stale = cache is None or type(cache) is not self.cache_type
        if stale or cache.max_len < needed or cache.keys.shape[1] != batch:
            self.model.cache = None  # free the old one before allocating
            cache = self.cache_type(self.config, needed, batch, self.device, self.dtype)
            self.model.cache = cache
        cache.trim(0)
        return cache


def build_runner(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Runner:
    from kerneltriage.backends.torch.load import load_model

    return Runner(load_model(checkpoint, device, dtype), checkpoint, device, dtype)
