"""Drafting with a model, backend-neutral: the k-step loop a draft model runs, and the layer-skip drafter (the
target's own first L layers). A backend supplies its array operations: how a drafted token is picked from logits,
how its model is built empty, and a view of the first L layers of its KV cache (backends/*/speculative.py).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.speculative.draft import Draft
from kerneltriage.engine.speculative.drafters import DraftFn

Array = Any  # a backend's device array
# a draft's logits (1, V) → the drafted token (1, 1), drawn by the sampler's rule (a backend's array operation)
PickFn = Callable[[Array], Array]
# the parts of the target the layer-skip draft runs as they are: its embedding, final norm, output head and
# attention function (a lever's replacement included), and its RoPE table, named as each backend's model names it
SHARED_PARTS = ("embed_tokens", "norm", "lm_head", "attention")
ROPE_PARTS = ("inv_freq", "freqs")  # torch's inverse frequencies; MLX's frequencies (mx.fast.rope's argument)
LOCAL_ROPE_PARTS = ("inv_freq_local", "freqs_local")  # the sliding layers' own (Gemma-3), where a model has them


class DraftModel(Protocol):
    """What drafting asks of a backend's model (backends/*/models/llama.py: Model)."""

    config: ModelConfig
    layers: Any  # its blocks: a slice is the first L of them
    cache: Any
    # the output head, (…, hidden) → (…, V): an attribute, since the layer-skip draft points it at the target's
    logits: Callable[[Array], Array]

    def hidden(self, tokens: Array, start: int) -> Array:
        """Final-normed hidden states (1, T, hidden) of tokens (1, T) at positions start…; fills the cache."""


def draft_steps(model: DraftModel, feed: Array, start: int, k: int, pick: PickFn) -> list[Array]:
    """k drafted tokens (1, 1) each: the model run over `feed` (1, F) (the context it has not seen) at `start`,
    then over each token it drafted."""
    tokens, step = [], feed
    for _ in range(k):
        logits = model.logits(model.hidden(step, start)[:, -1])  # (1, V)
        start += step.shape[1]
        step = pick(logits)  # (1, 1)
        tokens.append(step)
    return tokens


class SelfDrafter:
    """The target's first L layers, its final norm and output head (layer skip), sharing the target's KV cache.

    Sharing is exact: layers < L see the same inputs in both models, so the target's entries are the ones the
    draft would write. The draft writes positions start…start+k-1; the verify forward then rewrites start…start+k
    in every layer, and the target's trim covers both. So the draft resumes at the target's committed length.
    The output head is the target's as its levers left it (a kernel at `lm_head` included), taken at each reset:
    the draft is the target's own first layers as configured, not a stock copy of them."""

    def __init__(self, target: DraftModel, layers: int, empty: Callable[[ModelConfig], DraftModel],
                 prefix_cache: Callable[[Any, int], Any], draft_tokens: DraftFn) -> None:
        """`empty(config)`: an unfilled model of the backend's (no weights allocated); `prefix_cache(cache, L)`: a
        view of the first L layers of `cache` that writes into it; `draft_tokens`: the backend's k-step draft."""
        self.model = empty(target.config.replace(num_layers=layers))
        rope = [part for part in ROPE_PARTS if hasattr(target, part)]
        assert len(rope) == 1, f"a model holds one RoPE table of {ROPE_PARTS}, got {rope}"
        local = [part for part in LOCAL_ROPE_PARTS if hasattr(target, part)]
        for part in SHARED_PARTS + tuple(rope) + tuple(local):
            setattr(self.model, part, getattr(target, part))
        self.model.layers = target.layers[:layers]
        self.target, self.layers = target, layers
        self.prefix_cache, self.draft_tokens = prefix_cache, draft_tokens

    def reset(self, runner: Any, capacity: int) -> None:
        self.model.cache = self.prefix_cache(runner.model.cache, self.layers)
        self.model.logits = self.target.logits  # a lever may have replaced the target's output head

    def draft(self, context: list[int], k: int, sampler: Any) -> Draft:
        committed = len(context) - 1  # the target has cached every token but the last
        self.model.cache.length = committed
        return self.draft_tokens(self.model, context[committed:], committed, k, sampler)
