"""The backend-neutral part of model drafting and of putting speculation on a runner: a draft model fed only the
context it has not seen (its cache kept across steps), the choice of the drafter a `Speculation` names, and the
decoder installed as the runner's token loop. A backend supplies how its draft model runs k steps (`DraftFn`),
its layer-skip drafter and how it builds a runner for a draft checkpoint (backends/*/speculative.py).
"""

from __future__ import annotations

from typing import Any, Callable

from kerneltriage.core.errors import InputError
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.decoding import ONE_SYNC
from kerneltriage.engine.speculative.config import Speculation, check_same_vocabulary
from kerneltriage.engine.speculative.decoder import SpeculativeDecoder
from kerneltriage.engine.speculative.draft import Draft, Drafter
from kerneltriage.engine.speculative.lookup import lookup_drafter
from kerneltriage.engine.speculative.resident import RESIDENT_SLACK

# (the draft model, tokens to feed, their first position, k, the sampler) → k drafted tokens
DraftFn = Callable[[Any, list[int], int, int, Any], Draft]


class ModelDrafter:
    """A smaller model with the target's tokenizer and its own cache, fed the context it has not seen yet."""

    def __init__(self, runner: Any, draft_tokens: DraftFn) -> None:
        self.runner, self.draft_tokens = runner, draft_tokens
        self.seen = 0  # context[:seen] is in the draft's cache (the context only grows)
        self.pending: Any = None  # drafts fed after context[:seen] (a device array), read after the verify's sync

    def reset(self, runner: Any, capacity: int) -> None:
        self.runner.reset_cache(capacity)
        self.seen, self.pending = 0, None

    def draft(self, context: list[int], k: int, sampler: Any) -> Draft:
        fed = self.pending.tolist() if self.pending is not None else []
        valid = self.seen + _common_prefix(fed, context[self.seen:-1])  # the accepted drafts stay cached
        self.runner.trim_cache(valid)
        draft = self.draft_tokens(self.runner.model, context[valid:], valid, k, sampler)
        self.seen, self.pending = len(context), draft.tokens[:-1]  # the last draft was predicted, never fed
        return draft


def _common_prefix(a: list[int], b: list[int]) -> int:
    size = min(len(a), len(b))
    return next((i for i in range(size) if a[i] != b[i]), size)


def build_drafter(speculation: Speculation, runner: Any, self_drafter: Callable[[int], Drafter],
                  draft_runner: Callable[[Checkpoint], Drafter],
                  head_drafter: Callable[[str | None], Drafter] | None = None) -> Drafter:
    """The drafter `speculation` names for this target: a lookup, the target's first layers (`self_drafter(L)`;
    more layers than the model has is an InputError), a draft model (`draft_runner(checkpoint)`, which must
    share the target's vocabulary) or an EAGLE-style head (`head_drafter(path)`, where the backend has one)."""
    lookup = lookup_drafter(speculation)
    if lookup is not None:
        return lookup
    if speculation.source == "eagle":
        if head_drafter is None:
            raise InputError(f"--spec {speculation.source_text}: an EAGLE head runs on the torch backend only; "
                             "expected --backend torch")
        return head_drafter(speculation.head)
    if speculation.source == "selfdraft":
        total = runner.config.num_layers
        layers = speculation.layers or max(total // 2, 1)
        if layers > total:
            raise InputError(f"--spec selfdraft:{layers}: expected at most the model's {total} layers")
        return self_drafter(layers)
    from kerneltriage.engine.sources import load_checkpoint

    assert speculation.draft_model is not None  # Speculation's own check: a draft source names its model
    checkpoint = load_checkpoint(speculation.draft_model, f"--spec {speculation.source_text!r}")
    check_same_vocabulary(runner.checkpoint, checkpoint)
    return draft_runner(checkpoint)


def install(runner: Any, speculation: Speculation, drafter: Drafter, slack: int = 0) -> SpeculativeDecoder:
    """The decoder as `runner`'s token loop, with cache room past the end for the deepest verify (or `slack`);
    with `one_sync` its steps are queued ahead where they can run resident (resident.py), with room for them."""
    decoder = SpeculativeDecoder(speculation, drafter, queue_ahead=runner.run_config.has(ONE_SYNC))
    resident = decoder.queue_ahead and getattr(runner, "resident", False)
    runner.use_loop(decoder, max(decoder.deepest(runner), slack, RESIDENT_SLACK if resident else 0))
    runner.speculation = decoder
    return decoder
