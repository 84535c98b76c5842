"""A loaded MLX model ready to run: the model, its cache, the step functions that levers replace, and the backend
protocol's runner methods (tokens in and out, a synchronized clock, logits on the host). The torch runner's
shape, slot for slot; what differs is that MLX builds graphs lazily and evaluates them when a value is read.

So the steps the runner takes are scheduled as they return (`mx.async_eval` of their logits), as a CUDA launch is
queued: a synchronized clock (`mx.synchronize`) then waits for the work it should time. Left lazy, a prefill
"timed" between two synchronized clocks is only the graph being built (a first bench showed 5,000 tok/s). A decode
step is the exception: a token loop samples from it at once, and the sampler queues the token with the step's graph
under it (`sampling.py`), one `async_eval` a token, as mlx-lm's `generate_step` does. Every `async_eval` costs the
host its own pass over the graph and its own commit, and a token evaluated inside the next step's graph would be
read only once that whole step has run (MLX signals an evaluation's outputs, not the arrays inside it). Where the
sampler waits for the last token on the host before it samples (a constraint), the loop queues the step first
(`queue`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from kerneltriage.backends.mlx import timing
from kerneltriage.backends.mlx.cache import KVCache
from kerneltriage.backends.mlx.models import Model
from kerneltriage.backends.mlx.models.llama import ROPES
from kerneltriage.backends.mlx.sampling import MlxSampler
from kerneltriage.core.roofline import DTYPE_BYTES
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.decoding import TokenLoop, plain_loop
from kerneltriage.engine.runner_base import RunnerBase, decode_one, prefill, verify_rows
from kerneltriage.engine.sampling import LogitsProcessor, SamplingParams

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Queued, Speculating

# (model, tokens (1, T), start) -> logits (1, V) of the last position
StepFn = Callable[[Model, mx.array, int], mx.array]
# (model, tokens (1, T), start) -> logits (T, V) of every position: the speculative verify forward
RowsFn = Callable[[Model, mx.array, int], mx.array]
# (model, token (1, 1), start, allowed ids) -> logits (1, V): only the allowed rows computed (vocab_compact)
CompactStepFn = Callable[[Model, mx.array, int, Sequence[int]], mx.array]


def _scheduled(logits: mx.array) -> mx.array:
    """The step's output, queued for evaluation now (module docstring)."""
    mx.async_eval(logits)
    return logits


class _Pending:
    """A token the sampler scheduled, read when asked: `result` waits for that token's evaluation only."""

    def __init__(self, token: mx.array) -> None:
        self.token = token

    def result(self) -> int:
        return int(self.token.item())  # type: ignore[arg-type]  # mlx's stub: item() -> int | float | complex


@dataclass
class Runner(RunnerBase):
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
    speculation: "Speculating | None" = None
    # Proof of execution: every lever's replacement code counts its own runs here.
    counters: Counter = field(default_factory=Counter)
    approximations: list[str] = field(default_factory=list)  # installed kernels' declared quality (engine/quality.py)
    backend: str = "mlx"
    compact_limit: int = 0  # the most allowed rows a decode step computes alone (vocab_compact); 0: never
    compact_step: "CompactStepFn | None" = None  # (model, token (1, 1), start, rows) -> logits (1, V)

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
    def new_cache(self, shape: tuple[int, int, int, int, int]) -> KVCache:
        return self.cache_type(shape, self.mx_dtype)

    @property
    def pads_verify(self) -> bool:
        return False  # a compiled step traces each verify shape once: no fixed-shape capture to pad to

    def prepare_steps(self, start: int, end: int, rows: Sequence[int], lookback: int = 0) -> None:
        """Nothing to capture ahead: MLX captures no fixed-shape steps."""

    @property
    def resident(self) -> bool:
        return False  # no verify drafts from a text kept on the device here: the speculative loop feeds each one

    def begin_resident(self, context: list[int], lookback: int) -> None:
        raise NotImplementedError("MLX runs no resident steps (`resident` is False)")

    def queue_step(self, reach: int, limits: tuple[int, int, int]) -> Queued:
        raise NotImplementedError("MLX runs no resident steps (`resident` is False)")

    # tokens in and out
    def tensor(self, tokens: Sequence[int]) -> mx.array:
        return mx.array([list(tokens)], dtype=mx.int32)  # (1, T)

    def prefill(self, tokens: Sequence[int], start: int) -> mx.array:
        return _scheduled(self.prefill_step(self.model, self.tensor(tokens), start))

    def decode(self, token: int | mx.array, position: int, rows: Sequence[int] | None = None) -> mx.array:
        step = token.reshape(1, 1) if isinstance(token, mx.array) else self.tensor([token])
        if rows is not None and self.compact_step is not None:
            return self.compact_step(self.model, step, position, rows)  # the sampler queues it (above)
        return self.decode_step(self.model, step, position)

    def queue(self, logits: mx.array) -> mx.array:
        return _scheduled(logits)

    def verify(self, last: int, drafts: Sequence[int] | mx.array, start: int, rows: int) -> mx.array:
        drafted = drafts if isinstance(drafts, mx.array) else mx.array(list(drafts))
        tokens = mx.concatenate([mx.array([last], dtype=mx.int32), drafted.astype(mx.int32)])  # (k+1,)
        return _scheduled(self.verify_step(self.model, tokens.reshape(1, -1), start))

    def sampler(self, params: SamplingParams, prompt: Sequence[int],
                processors: Sequence[LogitsProcessor] = ()) -> MlxSampler:
        return MlxSampler(params, list(prompt), (*processors, *self.workload_processors(len(prompt))))

    def masked(self, logits: mx.array, words: np.ndarray) -> mx.array:
        # the bitmask goes over as its int32 words (V/8 bytes) and is unpacked on the device
        bits = (mx.array(words)[:, None] >> mx.arange(32, dtype=mx.int32)) & 1  # (⌈V/32⌉, 32)
        return mx.where(bits.reshape(-1)[: logits.shape[-1]].astype(mx.bool_), logits, float("-inf"))

    def read_later(self, token: mx.array) -> _Pending:
        return _Pending(token)

    def greedy(self, logits: mx.array) -> int:
        return int(mx.argmax(logits, axis=-1).reshape(-1)[0].item())  # type: ignore[arg-type]  # as in _Pending

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
        arrays = {id(a): a.nbytes for a in dict(tree_flatten(self.model.parameters())).values()}
        cache = self.model.cache
        return sum(arrays.values()) + (0 if cache is None else cache.nbytes)

    def named_weights(self) -> dict[str, mx.array]:
        weights = dict(tree_flatten(self.model.parameters()))
        return {name: array for name, array in weights.items() if name not in ROPES}

    def host_logits(self, logits: mx.array) -> np.ndarray:
        return np.array(logits.astype(mx.float32), copy=True)


if TYPE_CHECKING:  # the type checker holds this runner to the backend protocol
    from kerneltriage.engine import backend as protocol

    def _conforms(runner: Runner) -> protocol.Runner:
        return runner
