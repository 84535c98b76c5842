"""The dispatch levers on the step functions: torch.compile of the decode step and verify, and CUDA graphs that
replay them. Counting follows `counting.py`: a compiled step counts the levers traced into it at each call; a
graphed step undoes what capture counted and counts, at every replay, what the captured call ran.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.runner import Runner, StepFn, decode_one, verify_rows
from kerneltriage.core.errors import InputError

GRAPH_WINDOW = 256  # captured decode graphs attend over a multiple of this many cache slots
PREFILL_BUCKET = 64  # a graphed prefill pads its prompt to a multiple of this many rows: one graph per 64 lengths
GRAPH_WARMUPS = 2  # eager runs before capture (lazy inits must not land in the graph)
Capture = Callable[[Callable[[], Any], int], tuple[Any, Any]]  # (fn, warm-ups) → (graph with .replay(), output)


@dataclass
class _Graph:
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
        self.graphs: dict[tuple[int, int], _Graph] = {}
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

    def entry(self, model: Model, rows: int, end: int, tokens: torch.Tensor | None, start: int) -> _Graph:
        """The graph of `rows` rows whose window holds positions up to `end`; captured now if it is new, writing the
        slots from `start` on (with `tokens`, or zeros)."""
        cache = self.attach(model.cache)
        window = self.window(cache, end)
        entry = self.graphs.get((window, rows))
        if entry is None:
            slot = torch.zeros((1, rows), dtype=torch.long, device=cache.keys.device) if tokens is None else tokens
            entry = self._capture(model, cache, window, slot, start)
        return entry

    def replay(self, model: Model, entry: _Graph, end: int) -> torch.Tensor:
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

    def _capture(self, model: Model, cache: StaticKVCache, window: int, tokens: torch.Tensor, start: int) -> _Graph:
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
            with _capturable_attention():
                if self.shared_pool:
                    self.pool = self.pool or torch.cuda.graph_pool_handle()
                    graph, logits = self.capture(counted, GRAPH_WARMUPS, pool=self.pool)
                else:
                    graph, logits = self.capture(counted, GRAPH_WARMUPS)
        finally:
            cache.window = None
        counters.subtract(sum(calls, Counter()))  # capture is not execution: only replays count
        self.graphs[window, slot.shape[1]] = _Graph(graph, slot, logits, calls[-1])
        return self.graphs[window, slot.shape[1]]


def _capturable_attention():  # noqa: ANN202 - a context manager
    """SDPA backends that survive stream capture. cuDNN attention broke capture of the default model's masked
    bf16 decode on an H200 (cudaErrorStreamCaptureInvalidated), so it is left out while capturing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def graphs(runner: Runner, value: str | None = None, capture_fn: Capture = capture) -> None:
    """dispatch: the decode step (and a speculative verify) captured in CUDA graphs (static cache, one graph
    per window bucket and row count); speculative steps may also run resident (their draft, their choice between
    a plain step and a verify, and their acceptance in the graph: backends/torch/resident.py)."""
    from kerneltriage.backends.torch import graph_switch
    from kerneltriage.backends.torch.resident import ResidentSteps

    runner.cache_type = StaticKVCache
    window = None if isinstance(runner.decode_step, CompiledStep) else GRAPH_WINDOW
    if capture_fn is not capture or graph_switch.available():  # (a captured step chooses through a SWITCH node)
        runner.resident_steps = ResidentSteps(runner, runner.decode_step, runner.verify_step, window, capture_fn)
    runner.decode_step = GraphedStep(runner, runner.decode_step, window, capture_fn)
    runner.verify_step = GraphedStep(runner, runner.verify_step, window, capture_fn)


class GraphedPrefill:
    """The prefill replayed from CUDA graphs: the prompt padded to a multiple of PREFILL_BUCKET rows with its last
    token repeated, and the logits of its real last row picked on the device. The filler is harmless: the causal
    mask hides it from the real rows, and its cache slots lie past the prompt, where the next steps write before
    anything reads them. A (window, rows) bucket is captured when first seen, as `graphs` captures a decode window
    (about three eager prefills: a warm-up absorbs it; capturing on a second sighting put the capture in the first
    timed sample on the H200); a prompt whose padding would pass the cache runs eagerly."""

    def __init__(self, runner: Runner, capture_fn: Capture = capture) -> None:
        self.runner, self.eager = runner, runner.prefill_step
        self.last_only = runner.run_config.has("last_logits")  # its deletion, kept: one row through lm_head
        self.last = torch.zeros(1, dtype=torch.long, device=runner.device)  # the real last row, set per call
        self.graphed = GraphedStep(runner, self._padded, GRAPH_WINDOW, capture_fn, lever="prefill_graphs",
                                   shared_pool=capture_fn is capture)

    def _padded(self, model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        if self.last_only:
            counting.ran(self.runner, "last_logits")
            return model.logits(model.hidden(tokens, start).index_select(1, self.last)[:, 0])  # (1, V)
        return model(tokens, start).index_select(1, self.last)[:, 0]  # every row's logits, as stock computes

    def __call__(self, model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        rows, cache = tokens.shape[1], model.cache
        padded = -(-rows // PREFILL_BUCKET) * PREFILL_BUCKET
        if start + padded > cache.max_len:
            return self.eager(model, tokens, start)
        self.last.fill_(rows - 1)
        logits = self.graphed(model, torch.cat([tokens, tokens[:, -1:].expand(1, padded - rows)], dim=1), start)
        cache.trim(start + rows)  # the filler's slots are not the prompt's
        return logits


def prefill_graphs(runner: Runner, value: str | None = None, capture_fn: Capture = capture) -> None:
    """dispatch: the prefill replayed from CUDA graphs, one per 64-row bucket of prompt lengths (static cache).
    The buckets' graphs share one memory pool (they never replay at once): a long prompt's activations are held
    once, not once per bucket seen."""
    runner.cache_type = StaticKVCache
    runner.cache_slack = max(runner.cache_slack, PREFILL_BUCKET - 1)  # room for the filler past any prompt
    runner.prefill_step = GraphedPrefill(runner, capture_fn)


class CompiledStep:
    """A step through torch.compile (Inductor fuses the elementwise ops and generates its own GEMVs).

    Positions are dynamic after the second step (ints are specialised once, then made symbolic), so one
    compilation serves the eager token loop; under `graphs` it is compiled once in the static layout.
    Compilation is lazy: a verify that never runs is never compiled. A prefill (`rows_dynamic`) marks the prompt
    length dynamic, so the first prompt's compilation serves every length (the stock layers traced: `fused_layer`
    steps aside while compiling). `lever` is the counter each call adds to."""

    def __init__(self, runner: Runner, step: StepFn, mode: str, lever: str | None = None,
                 rows_dynamic: bool = False) -> None:
        self.runner, self.lever, self.rows_dynamic = runner, lever or f"compile={mode}", rows_dynamic
        self.compiled = torch.compile(own_code(step), mode=None if mode == "default" else mode,
                                      fullgraph=not rows_dynamic)
        self.inside: set[str] = set()  # levers traced into this step (counting.ran): each call runs them

    def __call__(self, model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
        self.runner.counters[self.lever] += 1
        if self.rows_dynamic and tokens.shape[1] > 1:  # (a length of 1 would be specialised anyway)
            # maybe_: a prompt that fills the cache exactly makes copy_'s aliasing check specialise the length
            # (an H200 bench of pp512 failed on it under mark_dynamic); that one compilation is then per length
            torch._dynamo.maybe_mark_dynamic(tokens, 1)
        counting.TRACING.append(self)  # a compilation happens inside this call
        try:
            logits = self.compiled(model, tokens, start)
        finally:
            counting.TRACING.pop()
        for lever in self.inside:
            self.runner.counters[lever] += 1
        return logits


def own_code(step: Callable) -> Callable:
    """`step` with a code object of its own. Dynamo keeps compiled code, and counts recompilations (8 at most,
    then a hard failure under fullgraph), per code object: runners compiling the shared `decode_one` would each
    add entries to one cache while they live (a benchmark builds several per process). A copy per runner keeps
    one cache per runner, freed with it."""
    code = step.__code__.replace()  # an equal but distinct code object
    copy = types.FunctionType(code, step.__globals__, step.__name__, step.__defaults__, step.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = step.__kwdefaults__, step.__qualname__
    return copy


def compile_prefill(runner: Runner, value: str | None = None) -> None:
    """dispatch: the prefill step through torch.compile, the prompt length dynamic. An eager prefill is one
    Python call per op (~1,300 on the default model), host-bound on a small model (triage on the H200: 75% of a
    stock pp512 was host gap); compiled, it is one call with fused elementwise kernels."""
    runner.prefill_step = CompiledStep(runner, runner.prefill_step, "default", "compile_prefill", rows_dynamic=True)


def compile_steps(runner: Runner, mode: str) -> None:
    """dispatch: torch.compile of the decode step and the verify forward (applied before `graphs`, which then
    captures them)."""
    if runner.no_compile:
        raise InputError(f"--levers compile={mode}: {runner.no_compile} runs its own Triton kernels, which compile "
                         f"would trace; drop compile (graphs replays them)")
    runner.decode_step = CompiledStep(runner, decode_one, mode)
    runner.verify_step = CompiledStep(runner, verify_rows, mode)
