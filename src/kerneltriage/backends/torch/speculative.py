"""Speculative decoding on a torch runner: the model drafters (the target's own first layers, a draft model) and
its installation. The loop, prompt lookup and the depth controller are backend-neutral (engine/speculative/);
acceptance is in `sampling.py`, the verify forward on the runner.
"""

from __future__ import annotations

import torch

from kerneltriage.backends.torch.cache import KVCache
from kerneltriage.backends.torch.load import build_runner
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.runner import Runner, verify_rows
from kerneltriage.backends.torch.sampling import TorchSampler, draft_token
from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative import drafters
from kerneltriage.engine.speculative.config import TREE_EAGER_ONLY, Speculation
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.draft import Draft, Drafter
from kerneltriage.engine.speculative.drafters import ModelDrafter
from kerneltriage.engine.speculative.selfdraft import SelfDrafter, draft_steps


def draft_tokens(model: Model, feed: list[int], start: int, k: int, sampler: TorchSampler) -> Draft:
    """Run a draft model over `feed` (the context it has not seen) at `start`, then k-1 single steps: k tokens,
    argmax when greedy, else drawn from q = softmax(filter(logits)), q kept for the acceptance test."""
    probs: list[torch.Tensor] = []
    step = torch.tensor([feed], device=model.embed_tokens.weight.device)  # (1, F)
    tokens = draft_steps(model, step, start, k, lambda logits: draft_token(logits, sampler, probs))
    return Draft(torch.cat(tokens).view(-1), torch.cat(probs) if probs else None)


class _LayerPrefixCache(KVCache):
    """The first L layers of another cache, sharing its storage: no allocation, no copies."""

    def __init__(self, cache: KVCache, layers: int) -> None:  # no super().__init__: the storage is borrowed
        self.keys, self.values = cache.keys[:layers], cache.values[:layers]  # (L, B, Hkv, S, D) views
        self.max_len, self.length = cache.max_len, 0


def self_drafter(target: Model, layers: int) -> SelfDrafter:
    """The target's first `layers` layers as a drafter (engine/speculative/selfdraft.py)."""
    return SelfDrafter(target, layers, lambda config: type(target)(config, device="meta"), _LayerPrefixCache,
                       draft_tokens)


def model_drafter(runner: Runner) -> ModelDrafter:
    """A draft model's runner as a drafter (engine/speculative/drafters.py)."""
    return ModelDrafter(runner, draft_tokens)


def build_drafter(speculation: Speculation, runner: Runner) -> Drafter:
    """The drafter `speculation` names for this target (drafters.build_drafter)."""
    from kerneltriage.backends.torch.eagle import head_drafter  # (safetensors and the head: when asked for)

    return drafters.build_drafter(
        speculation, runner, lambda layers: self_drafter(runner.model, layers),
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
