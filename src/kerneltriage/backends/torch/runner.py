"""A loaded model ready to run: the model, its cache, the step functions that levers replace, and the backend
protocol's runner methods (tokens in and out, a synchronized clock, logits on the host)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np
import torch

from kerneltriage.backends.torch import timing
from kerneltriage.backends.torch.cache import KVCache, StaticKVCache
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.sampling import TorchSampler
from kerneltriage.backends.torch.tree import TreeCache, keep_branch
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.decoding import TokenLoop, plain_loop
from kerneltriage.engine.runner_base import RunnerBase, decode_one, prefill, verify_rows
from kerneltriage.engine.sampling import LogitsProcessor, SamplingParams
from kerneltriage.engine.speculative.resident import WIDEST
from kerneltriage.engine.speculative.tree import TokenTree

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Queued, Speculating

# (model, tokens (1, T), start) -> logits (1, V) of the last position
StepFn = Callable[[Model, torch.Tensor, int], torch.Tensor]
# (model, tokens (1, T), start) -> logits (T, V) of every position: the speculative verify forward
RowsFn = Callable[[Model, torch.Tensor, int], torch.Tensor]
# (model, token (1, 1), start, allowed ids) -> logits (1, V): only the allowed rows computed (vocab_compact)
CompactStepFn = Callable[[Model, torch.Tensor, int, Sequence[int]], torch.Tensor]
PINNED_SLOTS = 2  # host buffers for tokens in flight: the pipelined loop reads one while the next is copied


class ResidentQueue(Protocol):
    """The steps a runner queues resident on the device (resident.py: ResidentSteps), as the runner calls them."""

    def use(self, lookback: int) -> None: ...

    def prepare(self, model: Model, start: int, end: int, rows: list[int]) -> None: ...

    def begin(self, model: Model, context: list[int], lookback: int) -> None: ...

    def queue(self, model: Model, reach: int, limits: tuple[int, int, int]) -> "Queued": ...


class _Pending:
    """A token copied to pinned host memory without blocking; `result` waits for that copy only."""

    def __init__(self, token: torch.Tensor, host: torch.Tensor) -> None:
        self.host = host
        host.copy_(token.view(1), non_blocking=True)
        self.ready = torch.cuda.Event()
        self.ready.record()

    def result(self) -> int:
        self.ready.synchronize()
        return int(self.host[0])


class _Read:
    """A token read at once (CPU: the value is already there)."""

    def __init__(self, token: torch.Tensor | int) -> None:
        self.value = int(token)

    def result(self) -> int:
        return self.value


@dataclass
class Runner(RunnerBase):
    model: Model
    checkpoint: Checkpoint
    device: torch.device
    torch_dtype: torch.dtype
    prefill_step: StepFn = prefill
    decode_step: StepFn = decode_one
    verify_step: RowsFn = verify_rows
    token_loop: TokenLoop = plain_loop
    cache_type: type[KVCache] = KVCache
    cache_slack: int = 0  # extra slots past the last position (a padded speculative verify writes beyond it)
    no_compile: str | None = None  # the lever whose own kernels torch.compile must not trace, if any
    run_config: RunConfig = field(default_factory=RunConfig)
    speculation: "Speculating | None" = None
    resident_steps: "ResidentQueue | None" = None  # steps that draft from, choose by and append to the device's text
    compact_limit: int = 0  # the most allowed rows a decode step computes alone (vocab_compact); 0: never
    compact_step: "CompactStepFn | None" = None  # (model, token (1, 1), start, rows) -> logits (1, V)
    # Proof of execution: every lever's replacement code counts its own runs here.
    counters: Counter = field(default_factory=Counter)
    approximations: list[str] = field(default_factory=list)  # installed kernels' declared quality (engine/quality.py)
    backend: str = "torch"
    _pinned: list[torch.Tensor] = field(default_factory=list, repr=False)

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def dtype(self) -> str:
        return str(self.torch_dtype).removeprefix("torch.")

    @property
    def dtype_bytes(self) -> int:
        return self.torch_dtype.itemsize

    @property
    def gpu_index(self) -> int | None:
        return (self.device.index or 0) if self.device.type == "cuda" else None

    # the cache
    def cache_fits(self, cache: KVCache, needed: int, batch: int) -> bool:
        return cache.max_len >= needed and cache.keys.shape[1] == batch

    def new_cache(self, shape: tuple[int, int, int, int, int]) -> KVCache:
        return self.cache_type(shape, self.device, self.torch_dtype)

    @property
    def pads_verify(self) -> bool:
        return issubclass(self.cache_type, StaticKVCache)

    # tokens in and out
    def tensor(self, tokens: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(tokens)], dtype=torch.long, device=self.device)  # (1, T)

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int], start: int) -> torch.Tensor:
        return self.prefill_step(self.model, self.tensor(tokens), start)

    @torch.inference_mode()
    def decode(self, token: int | torch.Tensor, position: int, rows: Sequence[int] | None = None) -> torch.Tensor:
        step = token.view(1, 1) if isinstance(token, torch.Tensor) else self.tensor([token])
        if rows is not None and self.compact_step is not None:
            return self.compact_step(self.model, step, position, rows)
        return self.decode_step(self.model, step, position)

    def queue(self, logits: torch.Tensor) -> torch.Tensor:
        return logits  # launched as it was built

    @torch.inference_mode()
    def verify(self, last: int, drafts: Sequence[int] | torch.Tensor, start: int, rows: int) -> torch.Tensor:
        """Logits (k+1, V) of [last, drafts…] at start…, padded to `rows` with the last token repeated: the causal
        mask hides filler rows from the real ones. Drafts on the host go over in one copy, with `last`."""
        if isinstance(drafts, torch.Tensor):
            tokens = torch.cat([torch.tensor([last], device=self.device), drafts.to(self.device).view(-1)])
            count = len(tokens)
            padded = torch.cat([tokens, tokens[-1:].expand(max(rows - count, 0))]).view(1, -1)
        else:
            ids = [last, *map(int, drafts)]
            count = len(ids)
            padded = self.tensor(ids + ids[-1:] * max(rows - count, 0))
        return self.verify_step(self.model, padded, start)[:count]

    @torch.inference_mode()
    def prepare_steps(self, start: int, end: int, rows: Sequence[int], lookback: int = 0) -> None:
        """Capture ahead the fixed-shape steps (graphs) a run from `start` to `end` may replay: plain steps and
        verifies of each of `rows` (graphed.GraphedStep.prepare) — with `lookback`, resident steps instead of the
        verifies (the run verifies nothing host-fed); steps that are not captured need nothing."""
        steps: list[tuple[object, list[int]]] = [(self.decode_step, [1]), (self.verify_step, list(rows))]
        if lookback:  # one graph per window, of the widest step's rows
            self._resident_queue.use(lookback)
            steps[1] = (self._resident_queue, [WIDEST])
        for step, shapes in steps:
            prepare = getattr(step, "prepare", None)
            if prepare is not None and shapes:
                prepare(self.model, start, end, shapes)

    @property
    def resident(self) -> bool:
        return self.resident_steps is not None

    @property
    def _resident_queue(self) -> ResidentQueue:
        assert self.resident_steps is not None, "resident steps are run only where `resident`"
        return self.resident_steps

    @torch.inference_mode()
    def begin_resident(self, context: list[int], lookback: int) -> None:
        self._resident_queue.begin(self.model, context, lookback)

    @torch.inference_mode()
    def queue_step(self, reach: int, limits: tuple[int, int, int]) -> "Queued":
        return self._resident_queue.queue(self.model, reach, limits)

    @torch.inference_mode()
    def verify_tree(self, last: int, tree: TokenTree, start: int) -> torch.Tensor:
        """One forward over [last, tree nodes…] under the tree mask (backends/torch/tree.py): logits (N+1, V),
        row r the prediction after node r's path."""
        cache = self.model.cache
        assert cache is not None, "a tree is verified after its prefix was prefilled"
        # TreeCache is the cache as one tree forward sees it: the model calls only its positions and update
        self.model.cache = TreeCache(cache, tree, start)  # type: ignore[assignment]
        try:
            return self.verify_step(self.model, self.tensor([last, *tree.tokens]), start)
        finally:
            self.model.cache = cache

    def keep_branch(self, start: int, path: list[int]) -> None:
        """After a tree verify at `start`: keep the root and the accepted nodes `path` in order, drop the rest."""
        assert self.model.cache is not None, "a branch is kept after a tree verify"
        keep_branch(self.model.cache, start, path)

    def sampler(self, params: SamplingParams, prompt: Sequence[int],
                processors: Sequence[LogitsProcessor] = ()) -> TorchSampler:
        return TorchSampler(params, list(prompt), self.device, (*processors, *self.workload_processors(len(prompt))))

    def masked(self, logits: torch.Tensor, words: np.ndarray) -> torch.Tensor:
        # the bitmask goes over as its int32 words (V/8 bytes) and is unpacked on the device
        packed = torch.from_numpy(words).to(self.device, non_blocking=True)  # (⌈V/32⌉,)
        bits = (packed.unsqueeze(1) >> torch.arange(32, dtype=torch.int32, device=self.device)) & 1  # (⌈V/32⌉, 32)
        allowed = bits.view(-1)[: logits.shape[-1]].bool()  # (V,)
        return logits.masked_fill(~allowed, float("-inf"))

    def read_later(self, token: torch.Tensor) -> _Pending | _Read:
        if self.device.type != "cuda":
            return _Read(token)
        if not self._pinned:
            self._pinned = [torch.empty(1, dtype=torch.long, pin_memory=True) for _ in range(PINNED_SLOTS)]
        self._pinned.append(self._pinned.pop(0))  # the oldest slot: its token was read already
        return _Pending(token, self._pinned[-1])

    def greedy(self, logits: torch.Tensor) -> int:
        return int(logits.argmax(dim=-1).view(-1)[0])

    # clocks and memory
    def clock(self) -> float:
        return timing.synced_clock(self.device)

    def synchronize(self) -> None:
        timing.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        timing.reset_peak_memory(self.device)

    def peak_memory(self) -> int:
        return timing.peak_memory_bytes(self.device)

    def held_bytes(self) -> int:
        """Bytes of the storage behind the model's parameters and buffers (tied tensors once) and of its cache."""
        tensors = (*self.model.parameters(), *self.model.buffers())
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        cache = self.model.cache
        return sum(storages.values()) + (0 if cache is None else cache.nbytes)

    def named_weights(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters(remove_duplicate=False))

    def host_logits(self, logits: torch.Tensor) -> np.ndarray:
        return logits.detach().to("cpu", torch.float32, copy=True).numpy()

    @torch.inference_mode()
    def forced_logits(self, prompt: Sequence[int], fed: Sequence[int] | None, count: int
                      ) -> tuple[np.ndarray, list[int]]:
        return super().forced_logits(prompt, fed, count)


if TYPE_CHECKING:  # the type checker holds this runner to the backend protocol, tree verify included
    from kerneltriage.engine import backend as protocol

    def _conforms(runner: Runner, sampler: TorchSampler
                  ) -> tuple[protocol.Runner, protocol.TreeSteps, protocol.TreeSampler]:
        return runner, runner, sampler
