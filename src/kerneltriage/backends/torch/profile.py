"""Where decode and prefill time goes: torch.profiler over real steps, ops grouped into op classes.

Op classes come from `record_function` ranges installed from outside the model, on this instance, for
the profiled run only (`instrumented`): module forwards, the attention function, the rotary embedding,
the KV cache writes and the step function. An op belongs to its innermost range; copy and cast ops
count as "copies/casts" wherever they run (the cache writes excepted). Device time is CUDA kernel time
on a GPU, and CPU op self time on the CPU (where "device" and host are the same cores).
"""

from __future__ import annotations

import functools
import statistics
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from kerneltriage.backends.torch import timing
from kerneltriage.backends.torch.gates import record_sdpa_calls
from kerneltriage.engine.patching import patched
from kerneltriage.engine.probes import PhaseProfile, SdpaCall
from kerneltriage.backends.torch.models import llama
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine.sampling import SamplingParams

RANGE_PREFIX = "kt::"
STEP_RANGE, WINDOW_RANGE = "kt::step", "kt::window"
# Module attribute name → op class. Linear modules not named here (packed levers) are their own class.
MODULE_CLASSES = {
    "q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "o_proj",
    "gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj",
    "input_layernorm": "norms", "post_attention_layernorm": "norms", "q_norm": "norms", "k_norm": "norms",
    "norm": "norms", "lm_head": "output projection", "embed_tokens": "embedding",
    "mlp": "activation",  # the MLP's own ops, outside its three projections: silu(gate) · up
    "self_attn": "other", "layers": "other",  # reshapes; the residual adds of each block
}
COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous"})
CACHE_CLASS, COPIES_CLASS = "kv cache", "copies/casts"
OUTPUT_CLASS = "output projection"
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")
GRAPH_LAUNCHES = ("cudaGraphLaunch",)
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
UNATTRIBUTED = "unattributed (graph replay)"
GREEDY = SamplingParams()


@dataclass
class Instrumentation:
    """What the installed wrappers saw: rows per call of each Linear op class (e.g. the output projection)."""

    rows: dict[str, list[int]] = field(default_factory=dict)


def _ranged(fn: Callable, label: str, on_call: Callable[[tuple], None] | None = None) -> Callable:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if on_call is not None:
            on_call(args)
        with record_function(label):
            return fn(*args, **kwargs)
    return wrapped


def _module_class(name: str, module: nn.Module) -> str | None:
    last = name.rsplit(".", 1)[-1]
    parent = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if last.isdigit() and parent == "layers":
        return MODULE_CLASSES["layers"]
    return MODULE_CLASSES.get(last, last if isinstance(module, nn.Linear) else None)


@contextmanager
def instrumented(runner: Runner) -> Iterator[Instrumentation]:
    """Ranges around every op class of `runner` (its model, current cache and decode step) for the block.

    A compiled decode step keeps only its step range: wrappers inside it would force a recompilation."""
    seen = Instrumentation()
    with ExitStack() as stack:
        if not runner.run_config.has("compile"):
            _wrap_model(stack, runner.model, seen)
        stack.enter_context(patched(runner, "decode_step", _ranged(runner.decode_step, STEP_RANGE)))
        yield seen


def _wrap_model(stack: ExitStack, model: nn.Module, seen: Instrumentation) -> None:
    for name, module in model.named_modules():
        cls = _module_class(name, module)
        if cls is not None:
            hook = _row_counter(seen, cls) if isinstance(module, nn.Linear) else None
            stack.enter_context(patched(module, "forward", _ranged(module.forward, RANGE_PREFIX + cls, hook)))
    stack.enter_context(patched(model, "attention", _ranged(model.attention, RANGE_PREFIX + "attention")))
    stack.enter_context(patched(model, "rope", _ranged(model.rope, RANGE_PREFIX + "rope")))
    stack.enter_context(patched(llama, "apply_rope", _ranged(llama.apply_rope, RANGE_PREFIX + "rope")))
    if model.cache is not None:
        stack.enter_context(patched(model.cache, "update", _ranged(model.cache.update, RANGE_PREFIX + CACHE_CLASS)))


def _row_counter(seen: Instrumentation, cls: str) -> Callable[[tuple], None]:
    def count(args: tuple) -> None:
        seen.rows.setdefault(cls, []).append(int(args[0].shape[:-1].numel()))
    return count


def _activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def _range_class(event: Any, default: str) -> str:
    """The op class of a profiled op: copy/cast ops by name, else its innermost kt:: range, else `default`."""
    parent, cls = event.cpu_parent, None
    while parent is not None and cls is None:
        if parent.name.startswith(RANGE_PREFIX) and parent.name not in (STEP_RANGE, WINDOW_RANGE):
            cls = parent.name.removeprefix(RANGE_PREFIX)
        parent = parent.cpu_parent
    if event.name in COPY_OPS and cls != CACHE_CLASS:
        return COPIES_CLASS
    if cls is None:
        return "other" if _inside(event, STEP_RANGE) else default
    return cls


def _inside(event: Any, range_name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None and parent.name != range_name:
        parent = parent.cpu_parent
    return parent is not None


def _union_us(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@dataclass
class _Tally:
    classes: dict[str, float] = field(default_factory=dict)  # microseconds
    kernels: dict[str, int] = field(default_factory=dict)  # kernels launched per op class
    device: list[tuple[float, float]] = field(default_factory=list)
    launches: int = 0
    graph_launches: int = 0
    syncs: int = 0

    def add(self, cls: str, us: float) -> None:
        if us > 0:
            self.classes[cls] = self.classes.get(cls, 0.0) + us


def _host(events: Sequence[Any]) -> Iterator[Any]:
    return (e for e in events if e.device_type == DeviceType.CPU)


def _annotation(event: Any) -> bool:
    """A record_function range mirrored onto the GPU timeline (not device work)."""
    return event.name.startswith(RANGE_PREFIX) or bool(getattr(event, "is_user_annotation", False))


def _tally(events: Sequence[Any], cuda: bool, default: str) -> _Tally:
    """Sum device time per op class and count runtime calls, inside the kt::window range only."""
    window = next(e for e in _host(events) if e.name == WINDOW_RANGE).time_range
    tally = _Tally()
    for event in events:
        if event.device_type != DeviceType.CPU:
            if not _annotation(event):  # a kernel, memcpy or memset; the GPU timeline: all of it
                tally.device.append((event.time_range.start, event.time_range.end))
            continue
        if not window.start <= event.time_range.start <= window.end or event.name.startswith(RANGE_PREFIX):
            continue
        tally.launches += event.name.startswith(KERNEL_LAUNCHES)
        tally.graph_launches += event.name.startswith(GRAPH_LAUNCHES)
        tally.syncs += event.name in SYNC_CALLS
        if cuda:
            cls = _range_class(event, default)
            tally.add(cls, sum(k.duration for k in event.kernels))
            if event.kernels:
                tally.kernels[cls] = tally.kernels.get(cls, 0) + len(event.kernels)
        elif event.name.startswith("aten::"):
            tally.add(_range_class(event, default), event.self_cpu_time_total)
    return tally


def _summarize(prof: Any, phase: str, passes: int, tokens: int, wall: float, cuda: bool,
               seen: Instrumentation, default: str, calls: Sequence[SdpaCall]) -> PhaseProfile:
    tally = _tally(prof.events(), cuda, default)
    if cuda:
        kernel_us = sum(end - start for start, end in tally.device)
        tally.add(UNATTRIBUTED, kernel_us - sum(tally.classes.values()))
        unattributed = len(tally.device) - sum(tally.kernels.values())
        if unattributed > 0:
            tally.kernels[UNATTRIBUTED] = unattributed
        busy_us = _union_us(tally.device)
    else:
        busy_us = sum(tally.classes.values())
    per_pass = 1e-6 / passes
    return PhaseProfile(
        phase, passes, tokens, {k: v * per_pass for k, v in sorted(tally.classes.items())}, busy_us * per_pass,
        len(tally.device) / tokens, tally.launches / tokens, tally.graph_launches / tokens, tally.syncs / tokens,
        wall / passes, tuple(seen.rows.get(OUTPUT_CLASS, ())), tuple(calls),
        {k: n / tokens for k, n in sorted(tally.kernels.items())},
    )


@torch.inference_mode()
def profile_prefill(runner: Runner, prefix: Sequence[int], prompt: Sequence[int], warmup: bool = True
                    ) -> PhaseProfile:
    """One prefill of `prompt` after `prefix` (filled untimed), profiled; a warm-up pass first unless the
    caller has just run this very prefill."""
    runner.reset_cache(len(prefix) + len(prompt))
    if prefix:
        runner.prefill(prefix, 0)
    depth = len(prefix)
    if warmup:  # lazy inits stay out of the window
        runner.prefill(prompt, depth)
        runner.trim_cache(depth)
    with instrumented(runner) as seen, profile(activities=_activities(runner.device)) as prof:
        start = timing.synced_clock(runner.device)
        with record_function(WINDOW_RANGE), record_sdpa_calls() as calls:
            runner.prefill(prompt, depth)
        wall = timing.synced_clock(runner.device) - start  # the sync stays outside the window
    return _summarize(prof, "prefill", 1, len(prompt), wall, runner.device.type == "cuda", seen, "other", calls)


def _started_loop(runner: Runner, prefix: Sequence[int], steps: int) -> Iterator[int]:
    """The runner's token loop for `steps` + 1 tokens after a prefill of `prefix`, its first token taken."""
    runner.reset_cache(len(prefix) + steps + 1)
    logits = runner.prefill(prefix, 0)
    loop = runner.loop(logits, len(prefix), steps + 1, runner.sampler(GREEDY, prefix))
    next(loop)
    return loop


@torch.inference_mode()
def profile_decode(runner: Runner, prefix: Sequence[int], steps: int) -> PhaseProfile:
    """`steps` tokens of the runner's own token loop after a prefill of `prefix`, profiled after a warm-up
    loop; the first token (from the prefill's logits) stays outside the window. Ops outside the step
    function (sampling, the host readback) count as "sampling"."""
    list(_started_loop(runner, prefix, steps))  # warm-up (graph capture, lazy inits)
    loop = _started_loop(runner, prefix, steps)
    with instrumented(runner) as seen, profile(activities=_activities(runner.device)) as prof:
        start = timing.synced_clock(runner.device)
        with record_function(WINDOW_RANGE), record_sdpa_calls() as calls:
            count = sum(1 for _ in loop)
        wall = timing.synced_clock(runner.device) - start
    passes = sum(1 for e in _host(prof.events()) if e.name == STEP_RANGE) or 1
    return _summarize(prof, "decode", passes, count, wall, runner.device.type == "cuda", seen, "sampling", calls)


@torch.inference_mode()
def host_issue_seconds(runner: Runner, prefix: Sequence[int], steps: int) -> float:
    """Median seconds the host spends issuing one decode step (the step function returning, before the
    device finishes it), unprofiled. Only meaningful where host and device differ (CUDA)."""
    runner.reset_cache(len(prefix) + steps + 1)
    logits = runner.prefill(prefix, 0)
    token = logits.argmax(dim=-1).view(1)  # (1,)
    issued = []
    for position in range(len(prefix), len(prefix) + steps):
        start = timing.synced_clock(runner.device)
        runner.decode(token, position)
        issued.append(time.perf_counter() - start)
    timing.synchronize(runner.device)
    return statistics.median(issued[1:] or issued)  # the first step may capture or allocate
