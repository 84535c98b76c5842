"""The dispatch levers on the step functions: torch.compile of the decode step and verify, and CUDA graphs that
replay them (graphed.py). Counting follows `counting.py`: a compiled step counts the levers traced into it at each
call; a graphed step undoes what capture counted and counts, at every replay, what the captured call ran.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from kerneltriage.backends.torch import counting, graph_switch
from kerneltriage.backends.torch.cache import StaticKVCache
from kerneltriage.backends.torch.cudagraph import capture
from kerneltriage.backends.torch.graphed import Capture, GraphedStep
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.resident import ResidentSteps
from kerneltriage.backends.torch.runner import Runner, StepFn, decode_one, verify_rows
from kerneltriage.core.errors import InputError

GRAPH_WINDOW = 256  # captured decode graphs attend over a multiple of this many cache slots
PREFILL_BUCKET = 64  # a graphed prefill pads its prompt to a multiple of this many rows: one graph per 64 lengths


def graphs(runner: Runner, value: str | None = None, capture_fn: Capture = capture) -> None:
    """dispatch: the decode step (and a speculative verify) captured in CUDA graphs (static cache, one graph
    per window bucket and row count); speculative steps may also run resident (their draft, their choice between
    a plain step and a verify, and their acceptance in the graph: backends/torch/resident.py)."""
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
    runner.use_loop(slack=PREFILL_BUCKET - 1)  # room for the filler past any prompt
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
