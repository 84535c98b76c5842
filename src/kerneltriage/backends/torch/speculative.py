"""Speculative decoding on a torch runner: the model drafters (the target's own first layers, a draft model) and
its installation. The loop, prompt lookup and the depth controller are backend-neutral (engine/speculative/);
acceptance is in `sampling.py`, the verify forward on the runner.
"""

from __future__ import annotations

import torch
from torch import nn

from kerneltriage.backends.torch.cache import KVCache
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.runner import Runner, verify_rows
from kerneltriage.backends.torch.acceptance import sample_probs
from kerneltriage.backends.torch.sampling import TorchSampler, filter_logits
from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative import drafters
from kerneltriage.engine.speculative.config import TREE_EAGER_ONLY, Speculation
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.draft import Draft, Drafter
from kerneltriage.engine.speculative.drafters import ModelDrafter


def draft_tokens(model: Model, feed: list[int], start: int, k: int, sampler: TorchSampler) -> Draft:
    """Run a draft model over `feed` (the context it has not seen) at `start`, then k-1 single steps: k tokens,
    argmax when greedy, else drawn from q = softmax(filter(logits)), q kept for the acceptance test."""
    device = model.embed_tokens.weight.device
    tokens, probs = [], []
    step = torch.tensor([feed], device=device)  # (1, F)
    for _ in range(k):
        logits = model.logits(model.hidden(step, start)[:, -1])  # (1, V)
        start += step.shape[1]
        step = draft_token(logits, sampler, probs)
        tokens.append(step.view(1))
    return Draft(torch.cat(tokens), torch.cat(probs) if probs else None)


def draft_token(logits: torch.Tensor, sampler: TorchSampler, probs: list[torch.Tensor]) -> torch.Tensor:
    """A drafted token (1, 1) from a draft's logits (1, V): the argmax when greedy, else drawn from
    q = softmax(filter(logits)), q appended to `probs` for the acceptance test."""
    if sampler.params.greedy:
        return logits.argmax(dim=-1, keepdim=True)
    probs.append(filter_logits(logits, sampler.params).softmax(-1))
    return sample_probs(probs[-1], sampler.generator).view(1, 1)


class _LayerPrefixCache(KVCache):
    """The first L layers of another cache, sharing its storage: no allocation, no copies."""

    def __init__(self, cache: KVCache, layers: int) -> None:  # no super().__init__: the storage is borrowed
        self.keys, self.values = cache.keys[:layers], cache.values[:layers]  # (L, B, Hkv, S, D) views
        self.max_len, self.length = cache.max_len, 0


class SelfDrafter:
    """The target's first L layers, its final norm and lm_head (layer skip), sharing the target's KV cache.

    Sharing is exact: layers < L see the same inputs in both models, so the target's entries are the ones the
    draft would write. The draft writes positions start…start+k-1; the verify forward then rewrites start…start+k
    in every layer, and the target's trim covers both. So the draft resumes at the target's committed length."""

    def __init__(self, target: Model, layers: int) -> None:
        self.model = type(target)(target.config.replace(num_layers=layers), device="meta")
        self.model.embed_tokens, self.model.norm, self.model.lm_head = target.embed_tokens, target.norm, target.lm_head
        self.model.layers = nn.ModuleList(target.layers[:layers])
        self.model.inv_freq = target.inv_freq
        self.model.attention = target.attention
        self.layers = layers

    def reset(self, runner: Runner, capacity: int) -> None:
        self.model.cache = _LayerPrefixCache(runner.model.cache, self.layers)

    def draft(self, context: list[int], k: int, sampler: TorchSampler) -> Draft:
        committed = len(context) - 1  # the target has cached every token but the last
        self.model.cache.length = committed
        return draft_tokens(self.model, context[committed:], committed, k, sampler)


def model_drafter(runner: Runner) -> ModelDrafter:
    """A draft model's runner as a drafter (engine/speculative/drafters.py)."""
    return ModelDrafter(runner, draft_tokens)


def build_drafter(speculation: Speculation, runner: Runner) -> Drafter:
    """The drafter `speculation` names for this target (drafters.build_drafter)."""
    from kerneltriage.backends.torch.backend import build_runner

    from kerneltriage.backends.torch.eagle import head_drafter

    return drafters.build_drafter(
        speculation, runner, lambda layers: SelfDrafter(runner.model, layers),
        lambda checkpoint: model_drafter(build_runner(checkpoint, runner.device, runner.torch_dtype)),
        lambda path: head_drafter(runner, path))


def install_speculation(runner: Runner, speculation: Speculation, drafter: Drafter | None = None
                        ) -> SpeculativeDecoder:
    """Put speculative decoding on `runner` (after its levers: the verify steps they installed are used)."""
    if speculation.tree and (runner.pads_verify or runner.verify_step is not verify_rows
                             or "flex_decode" in runner.levers):
        raise InputError(f"--spec {speculation.source_text} with --levers {','.join(runner.levers)}: "
                         f"{TREE_EAGER_ONLY}")
    # room for a padded verify, or a tree's nodes
    return drafters.install(runner, speculation, drafter or build_drafter(speculation, runner),
                            speculation.tree_nodes)
