"""Where decode and prefill time goes on MLX: each op class evaluated and timed apart, over real steps.

MLX has no op profiler on the CPU (Metal's GPU capture is a trace file for Xcode, not numbers), but its laziness
splits every op in two parts that can be timed apart: building the graph (host Python: the dispatch cost) and
evaluating it (the device's work). For the profiled run only, the model's leaf modules (projections, norms, the
embedding, the output head) and its attention, RoPE and cache-write functions are wrapped from outside
(`instrumented`): a wrapper first evaluates its inputs (work queued since the last op class: residual adds, the
activation, reshapes: counted as "other"), then builds its op (host time) and evaluates it (device time of its
class). Syncing at every op class removes the overlap MLX would give, as any profiler inflates; the step time the
shares are taken of comes from the unprofiled measurement. A compiled step is one class: wrappers cannot
evaluate inside a trace (a prefill, eager under `compile`, is timed op by op). Kernel, launch and sync counts are
not observable here and are reported as 0, as torch's CPU profile reports them.
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn

from kerneltriage.backends.mlx.models import llama
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.patching import patched
from kerneltriage.engine.probes import PhaseProfile, SdpaCall
from kerneltriage.engine.sampling import SamplingParams

# Module attribute name → op class; modules named packed_* (packed levers) are their own class.
MODULE_CLASSES = {
    "q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "o_proj",
    "gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj",
    "input_layernorm": "norms", "post_attention_layernorm": "norms", "q_norm": "norms", "k_norm": "norms",
    "norm": "norms", "lm_head": "output projection", "embed_tokens": "embedding",
}
OTHER, OUTPUT_CLASS, COMPILED_CLASS = "other", "output projection", "compiled step"
GREEDY = SamplingParams()


@dataclass
class Tally:
    """Seconds per op class (evaluation: the device's work), rows per output-head call, attention calls."""

    classes: dict[str, float] = field(default_factory=dict)
    output_rows: list[int] = field(default_factory=list)
    calls: list[SdpaCall] = field(default_factory=list)

    def add(self, cls: str, seconds: float) -> None:
        self.classes[cls] = self.classes.get(cls, 0.0) + seconds

    def timed(self, cls: str, build: Callable[[], Any], inputs: Sequence[Any]) -> Any:
        """Evaluate `inputs` (→ other), build the op (host time: the gap, not counted here), evaluate it (→ `cls`)."""
        start = time.perf_counter()
        mx.eval([a for a in inputs if isinstance(a, mx.array)])
        self.add(OTHER, time.perf_counter() - start)
        out = build()
        built = time.perf_counter()
        mx.eval(out)
        self.add(cls, time.perf_counter() - built)
        return out


class _Timed(nn.Module):
    """A leaf module standing in for `inner` while profiled: its calls timed as `cls`."""

    def __init__(self, inner: nn.Module, cls: str, tally: Tally) -> None:
        super().__init__()
        self.inner, self.cls, self.tally = inner, cls, tally

    def __call__(self, x: mx.array) -> mx.array:
        if self.cls == OUTPUT_CLASS:
            self.tally.output_rows.append(x.size // x.shape[-1])
        return self.tally.timed(self.cls, lambda: self.inner(x), (x,))

    def __getattr__(self, name: str) -> Any:  # weight, bits…: what levers and seams read through the module
        return getattr(self["inner"], name) if name != "inner" else super().__getattr__(name)


def _leaves(model: nn.Module) -> Iterator[tuple[nn.Module, str, str]]:
    """(parent, attribute, op class) of every module the profile times."""
    for _, module in list(model.named_modules()):
        for attribute, child in list(module.children().items()):
            if isinstance(child, nn.Module) and (attribute in MODULE_CLASSES or attribute.startswith("packed_")):
                yield module, attribute, MODULE_CLASSES.get(attribute, attribute)


@contextmanager
def _replaced(parent: Any, key: str, value: Any, item: bool) -> Iterator[None]:
    """Set `parent[key]` (a module's child) or the attribute `parent.key` for the block, then restore it."""
    if not item:
        with patched(parent, key, value):
            yield
        return
    old = parent[key]
    parent[key] = value
    try:
        yield
    finally:
        parent[key] = old


def _timed_function(tally: Tally, cls: str, fn: Callable) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        return tally.timed(cls, lambda: fn(*args, **kwargs), args)
    return call


@contextmanager
def instrumented(runner: Runner, phase: str, tally: Tally | None = None) -> Iterator[Tally]:
    """Timers around every op class of `runner`'s model and current cache, and SDPA calls recorded, for the block.
    Under `compile` the decode step is one class (a prefill stays eager: its ops are timed one by one)."""
    tally, model = tally or Tally(), runner.model
    with ExitStack() as stack:
        if phase == "decode" and runner.run_config.has("compile"):
            stack.enter_context(_replaced(runner, "decode_step", _timed_function(tally, COMPILED_CLASS,
                                                                                 runner.decode_step), False))
        else:
            for parent, attribute, cls in _leaves(model):
                stack.enter_context(_replaced(parent, attribute, _Timed(parent[attribute], cls, tally), True))
            for owner, name, cls in ((model, "attention", "attention"), (llama, "apply_rope", "rope"),
                                     (model.cache, "update", "kv cache")):
                stack.enter_context(_replaced(owner, name, _timed_function(tally, cls, getattr(owner, name)), False))
        stack.enter_context(_recording_sdpa(tally.calls))
        yield tally


@contextmanager
def _recording_sdpa(calls: list[SdpaCall]) -> Iterator[None]:
    """Record every mx.fast.scaled_dot_product_attention call made inside the block (shapes, not data)."""
    original = mx.fast.scaled_dot_product_attention

    def recording(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask: Any = None, **kwargs: Any) -> Any:
        array_mask = isinstance(mask, mx.array)
        calls.append(SdpaCall(tuple(q.shape), tuple(k.shape), str(q.dtype).removeprefix("mlx.core."),
                              tuple(mask.shape) if array_mask else None, mask == "causal" if isinstance(mask, str)
                              else False, q.shape[1] != k.shape[1],
                              _mask_is_causal(mask, q, k) if array_mask else None))
        return original(q, k, v, scale=scale, mask=mask, **kwargs)

    mx.fast.scaled_dot_product_attention = recording
    try:
        yield
    finally:
        mx.fast.scaled_dot_product_attention = original


def _mask_is_causal(mask: mx.array, q: mx.array, k: mx.array) -> bool | None:
    queries, keys = q.shape[2], k.shape[2]
    if queries != keys or queries < 2 or tuple(mask.shape[-2:]) != (queries, keys):
        return None
    causal = mx.arange(keys)[None, :] <= mx.arange(queries)[:, None]
    return bool(mx.all(mask == causal).item())


def _profile(phase: str, passes: int, tokens: int, wall: float, tally: Tally) -> PhaseProfile:
    per_pass = 1.0 / passes
    classes = {name: seconds * per_pass for name, seconds in sorted(tally.classes.items())}
    return PhaseProfile(phase, passes, tokens, classes, sum(classes.values()), 0.0, 0.0, 0.0, 0.0, wall / passes,
                        tuple(tally.output_rows), tuple(tally.calls))


def profile_prefill(runner: Runner, prefix: Sequence[int], prompt: Sequence[int]) -> PhaseProfile:
    """One prefill of `prompt` after `prefix` (filled untimed), profiled after a warm-up pass."""
    runner.reset_cache(len(prefix) + len(prompt))
    if prefix:
        mx.eval(runner.prefill(prefix, 0))
    depth = len(prefix)
    mx.eval(runner.prefill(prompt, depth))  # lazy inits stay out of the window
    runner.trim_cache(depth)
    with instrumented(runner, "prefill") as tally:
        start = time.perf_counter()
        mx.eval(runner.prefill(prompt, depth))
        wall = time.perf_counter() - start
    return _profile("prefill", 1, len(prompt), wall, tally)


def _started_loop(runner: Runner, prefix: Sequence[int], steps: int, sampler: Any = None) -> Iterator[int]:
    """The runner's token loop for `steps` + 1 tokens after a prefill of `prefix`, its first token taken."""
    runner.reset_cache(len(prefix) + steps + 1)
    logits = runner.prefill(prefix, 0)
    loop = runner.loop(logits, len(prefix), steps + 1, sampler or runner.sampler(GREEDY, prefix))
    next(loop)
    return loop


class _TimedSampler:
    """The generation's sampler with its sampling timed as "sampling" (the logits it is given are evaluated first)."""

    def __init__(self, inner: Any, tally: Tally) -> None:
        self.inner, self.tally, self.prompt = inner, tally, inner.prompt

    def __call__(self, logits: mx.array) -> mx.array:
        return self.tally.timed("sampling", lambda: self.inner(logits), (logits,))

    def accept(self, logits: mx.array, draft: Any) -> list[int]:
        return self.tally.timed("sampling", lambda: self.inner.accept(logits, draft), (logits,))

    @property
    def host_bound(self) -> bool:
        return bool(self.inner.host_bound)

    def follow(self, token: int) -> None:
        self.inner.follow(token)


def profile_decode(runner: Runner, prefix: Sequence[int], steps: int) -> PhaseProfile:
    """`steps` tokens of the runner's own token loop after a prefill of `prefix`, profiled after a warm-up loop;
    the first token (from the prefill's logits) stays outside the window."""
    list(_started_loop(runner, prefix, steps))  # warm-up (traces, lazy inits)
    passes, step, tally = [0], runner.decode_step, Tally()

    def counted(*args: Any) -> mx.array:
        passes[0] += 1
        return step(*args)

    with _replaced(runner, "decode_step", counted, False):
        loop = _started_loop(runner, prefix, steps, _TimedSampler(runner.sampler(GREEDY, prefix), tally))
        passes[0], tally.classes = 0, {}  # the prefill and its token stay outside the window
        with instrumented(runner, "decode", tally):
            start = time.perf_counter()
            count = sum(1 for _ in loop)
            wall = time.perf_counter() - start
    return _profile("decode", passes[0] or 1, count, wall, tally)


def host_issue_seconds(runner: Runner, prefix: Sequence[int], steps: int) -> float:
    """Median seconds the host spends building one decode step's graph (the step function returning, nothing
    evaluated yet), unprofiled. On MLX this is the dispatch cost on every device: the graph is built in Python
    before any of it runs."""
    runner.reset_cache(len(prefix) + steps + 1)
    token = mx.argmax(runner.prefill(prefix, 0), axis=-1)  # (1,)
    issued = []
    for position in range(len(prefix), len(prefix) + steps):
        mx.eval(token)
        start = time.perf_counter()
        logits = runner.decode(token, position)
        issued.append(time.perf_counter() - start)
        token = mx.argmax(logits, axis=-1)
    mx.eval(token)
    return statistics.median(issued[1:] or issued)  # the first step may trace or allocate
