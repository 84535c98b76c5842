"""Steps replayed from CUDA graphs: a step (decode, or a verify of T rows) captured once per attention window and
row count, replayed with its inputs copied into the captured slots; counting follows `counting.py`: capture undoes
what it counted, and every replay counts what the captured call ran. The `graphs` levers (accelerate.py) and the
resident steps (resident.py) are built on it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.runner import Runner, StepFn

GRAPH_WARMUPS = 2  # eager runs before capture (lazy inits must not land in the graph)
Capture = Callable[[Callable[[], Any], int], tuple[Any, Any]]  # (fn, warm-ups) → (graph with .replay(), output)


@dataclass
class CapturedGraph:
    """One captured step: its graph, input and output slots, and what each replay runs."""

    graph: Any  # torch.cuda.CUDAGraph
    tokens: torch.Tensor  # (1, T) input slot
    logits: torch.Tensor  # output slot: (1, V) for a decode step, (T, V) for a verify
    inside: Counter  # lever executions of the captured call: what each replay runs again


class GraphedStep:
    """A step (decode, or a speculative verify of T rows) replayed from CUDA graphs: one graph per
    (attention window, T), the window a multiple of `window_step`, captured on first use; recaptured when the
    cache is reallocated.

    `step` is the function captured: the stock one, or a compiled one (then one window: the whole cache,
    since every new window would be a new compilation). `capture` is injectable so that counting can be tested
    without a GPU. `shared_pool`: the graphs share one memory pool (they never replay at once), a new one after they
    are dropped (a pool whose graphs are all gone cannot be captured into again)."""

    def __init__(self, runner: Runner, step: StepFn, window_step: int | None, capture_fn: Capture = capture,
                 lever: str = "graphs", shared_pool: bool = False) -> None:
        self.runner, self.step, self.window_step, self.capture = runner, step, window_step, capture_fn
        self.lever, self.shared_pool = lever, shared_pool  # the counter each replay adds to; one pool for all
        self.graphs: dict[tuple[int, int], CapturedGraph] = {}
        self.cache: StaticKVCache | None = None
        self.pool = None

    def attach(self, cache: StaticKVCache) -> StaticKVCache:
        """`cache`, the graphs' from now on: a new (reallocated) cache drops the graphs captured on the old one."""
        if cache is not self.cache:
            self.graphs.clear()
            self.cache, self.pool = cache, None
        return cache

    def window(self, cache: StaticKVCache, end: int) -> int:
        """The attention window (cache slots) of a step ending at position `end`."""
        step = self.window_step or cache.max_len
        return min(cache.max_len, -(-end // step) * step)

    def __call__(self, model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        rows = tokens.shape[1]
        entry = self.entry(model, rows, start + rows, tokens, start)
        entry.tokens.copy_(tokens)
        model.cache.position.fill_(start)
        return self.replay(model, entry, start + rows)

    def entry(self, model: Model, rows: int, end: int, tokens: torch.Tensor | None, start: int) -> CapturedGraph:
        """The graph of `rows` rows whose window holds positions up to `end`; captured now if it is new, writing the
        slots from `start` on (with `tokens`, or zeros)."""
        cache = self.attach(model.cache)
        window = self.window(cache, end)
        entry = self.graphs.get((window, rows))
        if entry is None:
            slot = torch.zeros((1, rows), dtype=torch.long, device=cache.keys.device) if tokens is None else tokens
            entry = self._capture(model, cache, window, slot, start)
        return entry

    def replay(self, model: Model, entry: CapturedGraph, end: int) -> torch.Tensor:
        """Replay `entry` (its inputs set), counting what it runs; the cache holds positions up to `end` after it."""
        entry.graph.replay()
        model.cache.length = end
        self.runner.counters.update(entry.inside)  # what this replay ran
        self.runner.counters[self.lever] += 1
        return entry.logits

    def prepare(self, model: Model, start: int, end: int, rows: list[int]) -> None:
        """Capture now each graph of `rows` rows a run writing positions start…end-1 may replay (every window its
        steps can reach), so that none is captured in the middle of a run: which ones a speculative run needs
        depends on where the controller verifies, which differs from run to run, and a capture must not land inside
        a timed sample (on the H200 this did not remove the slow speculative runs: README, round 8). Captures write
        cache slots from `start` on, past the text so far: every later step writes a slot before anything reads it."""
        cache = self.attach(model.cache)
        step = self.window_step or cache.max_len
        for count in rows:
            last = min(end - 1 + count, cache.max_len)
            ends = [*range(start + count, last, step), last] if start + count <= last else []
            for window in sorted({self.window(cache, e) for e in ends}):
                # the first position whose rows end inside this window (the last one may be cut short by the cache)
                position = max(start, (window - 1) // step * step - count + 1)
                if (window, count) in self.graphs or position + count > cache.max_len \
                        or self.window(cache, position + count) != window:
                    continue
                self.entry(model, count, position + count, None, position)

    def _capture(self, model: Model, cache: StaticKVCache, window: int, tokens: torch.Tensor, start: int
                 ) -> CapturedGraph:
        # Warm-up and capture write slots start… with these very tokens, exactly what the replay writes next.
        slot, counters, calls = tokens.clone(), self.runner.counters, []

        def counted() -> torch.Tensor:
            before = Counter(counters)
            logits = self.step(model, slot, start)
            calls.append(Counter(counters) - before)
            return logits

        cache.position.fill_(start)
        cache.window = window
        try:
            with capturable_attention():
                if self.shared_pool:
                    self.pool = self.pool or torch.cuda.graph_pool_handle()
                    graph, logits = self.capture(counted, GRAPH_WARMUPS, pool=self.pool)
                else:
                    graph, logits = self.capture(counted, GRAPH_WARMUPS)
        finally:
            cache.window = None
        counters.subtract(sum(calls, Counter()))  # capture is not execution: only replays count
        self.graphs[window, slot.shape[1]] = CapturedGraph(graph, slot, logits, calls[-1])
        return self.graphs[window, slot.shape[1]]


def capturable_attention():  # noqa: ANN202 - a context manager (resident.py captures under it too)
    """SDPA backends that survive stream capture. cuDNN attention broke capture of the default model's masked
    bf16 decode on an H200 (cudaErrorStreamCaptureInvalidated), so it is left out while capturing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
