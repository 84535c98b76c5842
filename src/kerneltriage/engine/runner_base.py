"""What both backends' runners do the same way, whatever arrays they hold: the stock step functions, the cache's
sizing and bookkeeping, the token loop's dispatch and teacher-forced logits. A backend's `Runner` (a dataclass
with the fields named below) subclasses `RunnerBase` and adds its array operations: tensors from host tokens,
the cache it allocates, logits to the host, clocks and memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

from kerneltriage.engine.levers import Place

if TYPE_CHECKING:
    import numpy as np

    from kerneltriage.engine.backend import Sampler
    from kerneltriage.engine.config import ModelConfig

Array = Any  # a backend's device array


def prefill(model: Any, tokens: Array, start: int) -> Array:
    """The stock prefill: logits for every prompt position, the last one kept."""
    return model(tokens, start)[:, -1]


def decode_one(model: Any, token: Array, start: int) -> Array:
    """One decode step for token (1, 1) at position `start`."""
    return model(token, start)[:, -1]


def verify_rows(model: Any, tokens: Array, start: int) -> Array:
    """One forward over tokens (1, T) at positions start…start+T-1: logits for every row (T, V)."""
    return model(tokens, start)[0]


class RunnerBase:
    """The framework-free half of a runner. Its subclass has the fields `model` (with a `cache` slot and
    `cache_shape`), `checkpoint`, `run_config`, `cache_type`, `cache_slack`, `token_loop` and `speculation`."""

    model: Any
    checkpoint: Any
    backend: str
    run_config: Any
    cache_type: type
    cache_slack: int
    token_loop: Any
    speculation: Any
    if TYPE_CHECKING:  # a field of MLX's runner, a property of torch's (its torch.device's type): read-only here
        @property
        def device_type(self) -> str: ...

    @property
    def config(self) -> "ModelConfig":
        return self.checkpoint.config

    def use_loop(self, loop: Any | None = None, slack: int = 0) -> None:
        """Decode through `loop` (one_sync's pipelined loop, speculation's decoder; None: keep the current one),
        with at least `slack` cache slots past the last position (a verify or a padded prefill writes there)."""
        if loop is not None:
            self.token_loop = loop
        self.cache_slack = max(self.cache_slack, slack)

    @property
    def levers(self) -> tuple[str, ...]:
        return self.run_config.lever_names

    @property
    def place(self) -> Place:
        """Where levers would run: the backend, device type, architecture and the model's named seams."""
        return Place(self.backend, self.device_type, self.config.arch, self.model.SEAMS,
                     constrained=self.checkpoint.grammar is not None)

    # the cache
    def reset_cache(self, needed: int, batch: int = 1) -> Any:
        """A cache with room for `needed` positions (+ the slack, within the model's context); reused (and emptied)
        when big enough."""
        needed = min(needed + self.cache_slack, max(needed, self.config.max_context))
        cache = self.model.cache
        if cache is None or type(cache) is not self.cache_type or not self.cache_fits(cache, needed, batch):
            self.model.cache = None  # free the old one before allocating
            cache = self.new_cache(self.model.cache_shape(needed, batch))
            self.model.cache = cache
        cache.trim(0)
        return cache

    def cache_fits(self, cache: Any, needed: int, batch: int) -> bool:
        """The current cache holds `needed` positions of `batch` sequences."""
        return cache.max_len >= needed

    def new_cache(self, shape: tuple[int, int, int, int, int]) -> Any:
        """A new cache of `cache_type`, (L, B, Hkv, S, D), in the run's dtype on its device."""
        raise NotImplementedError

    def drop_cache(self) -> None:
        self.model.cache = None

    def trim_cache(self, length: int) -> None:
        self.model.cache.trim(length)

    @property
    def cache_capacity(self) -> int:
        return self.model.cache.max_len

    # tokens in and out
    def tensor(self, tokens: Sequence[int]) -> Array:
        """Host tokens as a (1, T) device array."""
        raise NotImplementedError

    def host_logits(self, logits: Array) -> "np.ndarray":
        """A float32 copy of device logits on the host, now (a graphed step's output slot is rewritten later)."""
        raise NotImplementedError

    def workload_processors(self, offset: int) -> tuple:
        """The workload's constraint as a logits processor, a fresh matcher for one generation after `offset` prompt
        tokens: none where the checkpoint carries no constraint."""
        grammar = self.checkpoint.grammar
        if grammar is None:
            return ()
        from kerneltriage.engine.constrained import ConstraintProcessor

        return (ConstraintProcessor(grammar, self.masked, offset),)

    def masked(self, logits: Array, words: "np.ndarray") -> Array:
        """`logits` (1, V) with every token whose bit is clear in the host bitmask `words` (int32) at -inf."""
        raise NotImplementedError

    def loop(self, logits: Array, start: int, count: int, sampler: "Sampler") -> Iterator[int]:
        return self.token_loop(self, logits, start, count, sampler)

    def forced_logits(self, prompt: Sequence[int], fed: Sequence[int] | None, count: int
                      ) -> tuple["np.ndarray", list[int]]:
        from kerneltriage.engine.forced import forced_logits

        return forced_logits(self, prompt, fed, count)
