"""A loaded MLX model ready to run: the model, its cache, the step functions that levers replace, and the backend
protocol's runner methods (tokens in and out, a synchronized clock, logits on the host). The torch runner's
shape, slot for slot; what differs is that MLX builds graphs lazily and evaluates them when a value is read.

So every step the runner takes is scheduled as it returns (`mx.async_eval` of its logits), as a CUDA launch is
queued: a synchronized clock (`mx.synchronize`) then waits for the work it should time. Left lazy, a prefill
"timed" between two synchronized clocks is only the graph being built (a first bench showed 5,000 tok/s).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from kerneltriage.backends.mlx import timing
from kerneltriage.backends.mlx.cache import KVCache
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.sampling import MlxSampler
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.decoding import TokenLoop, plain_loop
from kerneltriage.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from kerneltriage.engine.speculative.decoder import SpeculativeDecoder

# (model, tokens (1, T), start) -> logits (1, V) of the last position
StepFn = Callable[[Model, mx.array, int], mx.array]
# (model, tokens (1, T), start) -> logits (T, V) of every position: the speculative verify forward
RowsFn = Callable[[Model, mx.array, int], mx.array]
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def prefill(model: Model, tokens: mx.array, start: int) -> mx.array:
    """The stock prefill: logits for every prompt position, the last one kept."""
    return model(tokens, start)[:, -1]


def decode_one(model: Model, token: mx.array, start: int) -> mx.array:
    """One decode step for token (1, 1) at position `start`."""
    return model(token, start)[:, -1]


def verify_rows(model: Model, tokens: mx.array, start: int) -> mx.array:
    """One forward over tokens (1, T) at positions start…start+T-1: logits for every row (T, V)."""
    return model(tokens, start)[0]


def _scheduled(logits: mx.array) -> mx.array:
    """The step's output, queued for evaluation now (module docstring)."""
    mx.async_eval(logits)
    return logits


class _Pending:
    """A token scheduled (`mx.async_eval`) and read when asked: `result` waits for that token only."""

    def __init__(self, token: mx.array) -> None:
        self.token = token
        mx.async_eval(token)

    def result(self) -> int:
        return int(self.token.item())


@dataclass
class Runner:
    model: Model
    checkpoint: Checkpoint
    device: str  # "cpu" or "gpu", as MLX names its devices
    device_type: str  # "cpu", "metal" or "cuda"
    dtype: str
    prefill_step: StepFn = prefill
    decode_step: StepFn = decode_one
    verify_step: RowsFn = verify_rows
    token_loop: TokenLoop = plain_loop
    cache_type: type[KVCache] = KVCache
    cache_slack: int = 0  # extra slots past the last position (room for a speculative verify)
    run_config: RunConfig = field(default_factory=RunConfig)
    speculation: "SpeculativeDecoder | None" = None
    # Proof of execution: every lever's replacement code counts its own runs here.
    counters: Counter = field(default_factory=Counter)
    backend: str = "mlx"

    @property
    def config(self):  # noqa: ANN201 - ModelConfig, re-exported for callers
        return self.checkpoint.config

    @property
    def levers(self) -> tuple[str, ...]:
        return self.run_config.lever_names

    @property
    def mx_dtype(self) -> mx.Dtype:
        return getattr(mx, self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def gpu_index(self) -> int | None:
        return 0 if self.device_type == "cuda" else None  # NVML reads clocks of CUDA GPUs only

    # the cache
    def reset_cache(self, needed: int, batch: int = 1) -> KVCache:
        """A cache with room for `needed` positions (+ the slack); reused (and emptied) when big enough."""
        needed = min(needed + self.cache_slack, max(needed, self.config.max_context))
        cache = self.model.cache
        if cache is None or type(cache) is not self.cache_type or cache.max_len < needed:
            self.model.cache = None  # free the old one before allocating
            cache = self.cache_type(self.model.cache_shape(needed, batch), self.mx_dtype)
            self.model.cache = cache
        cache.trim(0)
        return cache

    def drop_cache(self) -> None:
        self.model.cache = None

    def trim_cache(self, length: int) -> None:
        self.model.cache.trim(length)

    @property
    def cache_capacity(self) -> int:
        return self.model.cache.max_len

    @property
    def pads_verify(self) -> bool:
        return False  # a compiled step traces each verify shape once: no fixed-shape capture to pad to

    def prepare_steps(self, start: int, end: int, rows: Sequence[int], lookback: int = 0) -> None:
        """Nothing to capture ahead: MLX captures no fixed-shape steps."""

    @property
    def resident(self) -> bool:
        return False  # no verify drafts from a text kept on the device here: the speculative loop feeds each one

    # tokens in and out
    def tensor(self, tokens: Sequence[int]) -> mx.array:
        return mx.array([list(tokens)], dtype=mx.int32)  # (1, T)

    def prefill(self, tokens: Sequence[int], start: int) -> mx.array:
        return _scheduled(self.prefill_step(self.model, self.tensor(tokens), start))

    def decode(self, token: int | mx.array, position: int) -> mx.array:
        step = token.reshape(1, 1) if isinstance(token, mx.array) else self.tensor([token])
        return _scheduled(self.decode_step(self.model, step, position))

    def verify(self, last: int, drafts: Sequence[int] | mx.array, start: int, rows: int) -> mx.array:
        tokens = mx.concatenate([mx.array([last], dtype=mx.int32), mx.array(drafts).astype(mx.int32)])  # (k+1,)
        return _scheduled(self.verify_step(self.model, tokens.reshape(1, -1), start))

    def sampler(self, params: SamplingParams, prompt: Sequence[int]) -> MlxSampler:
        return MlxSampler(params, list(prompt))

    def loop(self, logits: mx.array, start: int, count: int, sampler: MlxSampler) -> Iterator[int]:
        return self.token_loop(self, logits, start, count, sampler)

    def read_later(self, token: mx.array) -> _Pending:
        return _Pending(token)

    def greedy(self, logits: mx.array) -> int:
        return int(mx.argmax(logits, axis=-1).reshape(-1)[0].item())

    # clocks and memory
    def clock(self) -> float:
        return timing.synced_clock()

    def synchronize(self) -> None:
        timing.synchronize()

    def reset_peak_memory(self) -> None:
        timing.reset_peak_memory()

    def peak_memory(self) -> int:
        return timing.peak_memory_bytes(self.device_type)

    def held_bytes(self) -> int:
        """Bytes of the model's arrays (shared ones once: a tied head, packed projections' views count in the
        packed array) and of its cache."""
        arrays = {id(a): a.nbytes for _, a in tree_flatten(self.model.parameters())}
        cache = self.model.cache
        return sum(arrays.values()) + (0 if cache is None else cache.nbytes)

    def forced_logits(self, prompt: Sequence[int], fed: Sequence[int] | None, count: int
                      ) -> tuple[np.ndarray, list[int]]:
        from kerneltriage.backends.mlx.forced import forced_logits

        return forced_logits(self, prompt, fed, count)
