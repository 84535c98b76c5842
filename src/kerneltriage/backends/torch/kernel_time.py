"""A custom kernel's time per call in isolation against the stock op's, under guards (docs/kernels.md, "Planted
cheats"); its correctness check is kernel_check.py.

Lanes. CUDA: "chained" — CALLS calls captured back to back in a CUDA graph, replayed (the serial, launch-gap-free
regime of a decode step); "queued" — the same calls launched eagerly, many in flight. CPU: single calls on the host
clock, reported as both. "cold": the first and the second call at COLD_SHAPES row counts drawn fresh.

Every timed sample:
- its inputs hold values no call has seen (written in place, so a graph's pointers stay valid and a result cached
  by pointer, contents or shape is stale), and the output it left is checked against the stock op (timed-outputs:
  a kernel that caches only once it is timed);
- is bracketed by device-wide synchronizations and the judge's wall clock (core.integrity.wall, bound before any
  candidate loaded). CUDA events on the timing stream miss work left on another stream; the wall clock does not
  (device-sync), and the kernel is charged what the events missed. Threads a call started are waited for inside the
  bracket; one still running after JOIN_SECONDS is caught (background-thread);
- CUDA: starts from an emptied L2 with persistence reset (l2cache.py), on input sets that rotate over copies of the
  weights larger than the L2 together.
Samples are kept raw; a lane's time is their median (core/kernel_guards.py: spread, bimodality, cold calls).
"""

from __future__ import annotations

import random
import statistics
import threading
from typing import Any, Callable, Sequence

import torch

from kerneltriage.backends.torch import cudagraph, kernel_ops
from kerneltriage.backends.torch.kernel_ops import Inputs
from kerneltriage.backends.torch.l2cache import L2
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.timing import synchronize
from kerneltriage.core import integrity, kernel_guards
from kerneltriage.engine.kernels import Kernel
from kerneltriage.engine.probes import KernelTiming

CALLS, SAMPLES, WARMUPS = 20, 5, 2  # CUDA: calls per sample, samples, warm-up rounds
CPU_SAMPLES = 10  # CPU: single calls per side, alternating kernel and stock
COLD_SHAPES, COLD_ROWS = 2, range(2, 17)  # row counts for the cold lane (not the check's default 1 and 9)
JOIN_SECONDS = 2.0
SIDE_STREAM = 0.5  # device-sync: work the events missed above this share of the wall time (beyond stock's own gap)
SIDE_FLOOR = 20e-6  # … and above this many seconds per sample (host-side jitter of a synchronization)
Timed = Callable[[], Any]


@torch.inference_mode()
def time_lanes(model: Model, kernel: Kernel, rows: int, depth: int) -> list[KernelTiming]:
    """Seconds per call of kernel and stock in each lane at (rows, depth), then the cold lane."""
    device = model.embed_tokens.weight.device
    cold = _cold_lane(model, kernel, rows, depth)  # first: before any warm-up or graph capture
    lanes = _cuda_lanes if device.type == "cuda" else _cpu_lanes
    return lanes(model, kernel, rows, depth) + [cold]


def _verified(seam: str, args: Inputs, out: torch.Tensor) -> list[str]:
    """timed-outputs: the kernel's output of a timed call against the stock op on the same inputs."""
    if type(out) is not torch.Tensor:
        return [f"output-swapped: the output buffer came back as {type(out).__name__} from a timed call"]
    found, bound = kernel_ops.error_and_bound(seam, args, out)
    if found <= bound:
        return []
    return [f"timed-outputs: a timed call's output is {found:.1e} off (bound {bound:.1e}) on inputs refreshed "
            "before the sample: right when checked, not when timed (a result cached by pointer, contents or shape, "
            "or a call that skipped its work)"]


def _wait_started(before: set[threading.Thread]) -> tuple[bool, list[str]]:
    """(whether the call started threads, background-thread when one still runs JOIN_SECONDS after it)."""
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:
        thread.join(JOIN_SECONDS)
    alive = [t for t in started if t.is_alive()]
    return bool(started), [f"background-thread: {len(alive)} thread(s) a timed call started still ran "
                           f"{JOIN_SECONDS:.0f} s later ({alive[0].name})"] if alive else []


def _timing(seam: str, rows: int, depth: int, lane: str, samples: dict[str, list[float]], timer: str,
            work: tuple[float, float], flushed: bool, caught: Sequence[str]) -> KernelTiming:
    kernel, stock = samples["kernel"], samples["stock"]
    caught = [*caught, *filter(None, [kernel_guards.near_zero(kernel)])]
    labels = tuple(filter(None, [kernel_guards.bimodal(kernel)]))
    return KernelTiming(seam, rows, depth, lane, statistics.median(kernel), statistics.median(stock), timer,
                        tuple(kernel), tuple(stock), work[0], work[1], flushed, tuple(dict.fromkeys(caught)), labels)


def _cpu_lanes(model: Model, kernel: Kernel, rows: int, depth: int) -> list[KernelTiming]:
    """Single calls on the host clock, kernel and stock alternating, inputs refreshed before each."""
    gen = torch.Generator().manual_seed(7)
    args = kernel_ops.inputs(model, kernel.seam, rows, depth, gen)[0]
    calls = {"kernel": kernel.fn, "stock": kernel_ops.STOCK[kernel.seam]}
    outs = {name: kernel_ops.output(kernel.seam, args, poison=False) for name in calls}
    for name, fn in calls.items():
        for _ in range(WARMUPS):
            fn(*args, out=outs[name])
    samples: dict[str, list[float]] = {"kernel": [], "stock": []}
    caught: list[str] = []
    for i in range(CPU_SAMPLES):
        for name in ("kernel", "stock") if i % 2 == 0 else ("stock", "kernel"):
            kernel_ops.refill(kernel.seam, args, gen)
            before = set(threading.enumerate())
            start = integrity.wall()
            calls[name](*args, out=outs[name])
            end = integrity.wall()
            started, fired = _wait_started(before)
            samples[name].append((integrity.wall() if started else end) - start)  # a thread's work is the call's
            if name == "kernel":
                caught += fired + _verified(kernel.seam, args, outs[name])
    work = kernel_ops.work(kernel.seam, args, outs["kernel"])
    return [_timing(kernel.seam, rows, depth, lane, samples, "cpu clock", work, False, caught)
            for lane in ("chained", "queued")]


def _rotation(model: Model, seam: str, rows: int, depth: int, gen: torch.Generator) -> list[tuple[Inputs, Any]]:
    """At least CALLS input sets (each with its output), their weights rotating over copies that exceed the L2."""
    first = kernel_ops.inputs(model, seam, rows, depth, gen)[0]
    size = sum(a.nbytes for a in first if torch.is_tensor(a)) or 1
    l2 = torch.cuda.get_device_properties(first[0].device).L2_cache_size
    copies = max(2, min(64, -(-2 * l2 // size)))
    weights = [first] + [tuple(a.clone() if torch.is_tensor(a) else a for a in first) for _ in range(copies - 1)]
    active = kernel_ops.ACTIVATIONS[seam]
    sets = []
    for i in range(max(CALLS, copies)):
        fresh = first if i == 0 else kernel_ops.inputs(model, seam, rows, depth, gen)[0]
        args = tuple(fresh[j] if j in active else weights[i % copies][j] for j in range(len(first)))
        sets.append((args, kernel_ops.output(seam, args, poison=False)))
    return sets


def _cycle(fn: Any, sets: list[tuple[Inputs, Any]], state: dict[str, int]) -> Timed:
    """CALLS calls of `fn`, each on the next input set; `state["last"]` is the set the last call used."""
    def calls() -> None:
        for _ in range(CALLS):
            state["last"] = state["next"] % len(sets)
            state["next"] += 1
            args, out = sets[state["last"]]
            fn(*args, out=out)

    return calls


def _lane_run(lane: str, fn: Any, sets: list[tuple[Inputs, Any]], state: dict[str, int]) -> tuple[Timed | None,
                                                                                                    list[str]]:
    """What one sample runs: the calls eagerly (queued) or the graph captured from them (chained)."""
    calls = _cycle(fn, sets, state)
    if lane == "queued":
        for _ in range(WARMUPS):
            calls()
        return calls, []
    try:
        graph, _ = cudagraph.capture(calls, WARMUPS)
    except RuntimeError as exc:  # work left on another stream cannot be captured with the calling one
        return None, [f"graph-capture: the calls cannot be captured in a CUDA graph ({str(exc).splitlines()[0]})"]
    return graph.replay, []


def _cuda_sample(run: Timed, sets: list[tuple[Inputs, Any]], seam: str, gen: torch.Generator, l2: L2
                 ) -> tuple[float, float, list[str]]:
    """(event seconds, wall seconds, guards) of one sample: inputs refreshed, L2 emptied, device-wide bracket."""
    for args, _ in sets:
        kernel_ops.refill(seam, args, gen)
    caught = list(filter(None, [l2.prepare()]))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    before, began = set(threading.enumerate()), integrity.wall()
    start.record()
    run()
    end.record()
    caught += _wait_started(before)[1]
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3, integrity.wall() - began, caught


def _cuda_lane(lane: str, kernel: Kernel, sets: list[tuple[Inputs, Any]], gen: torch.Generator, l2: L2
               ) -> tuple[dict[str, list[float]], list[str]]:
    calls = {"kernel": kernel.fn, "stock": kernel_ops.STOCK[kernel.seam]}
    states = {name: {"next": 0, "last": 0} for name in calls}
    runs = {name: _lane_run(lane, fn, sets, states[name]) for name, fn in calls.items()}
    caught = [*runs["kernel"][1], *filter(None, [l2.prepare()])]  # a carve-out set in the warm-ups shows here
    timed = {name: run for name, (run, _) in runs.items() if run is not None}
    if len(timed) < len(runs):
        return {}, caught + runs["stock"][1]
    events: dict[str, list[float]] = {"kernel": [], "stock": []}
    walls: dict[str, list[float]] = {"kernel": [], "stock": []}
    for i in range(SAMPLES):
        for name in ("kernel", "stock") if i % 2 == 0 else ("stock", "kernel"):
            event, wall, fired = _cuda_sample(timed[name], sets, kernel.seam, gen, l2)
            events[name].append(event / CALLS)
            walls[name].append(wall / CALLS)
            if name == "kernel":
                args, out = sets[states[name]["last"]]
                caught += fired + _verified(kernel.seam, args, out)
    return _charged(events, walls, caught)


def _charged(events: dict[str, list[float]], walls: dict[str, list[float]], caught: list[str]
             ) -> tuple[dict[str, list[float]], list[str]]:
    """Each kernel sample charged what its events missed beyond stock's own gap between events and wall clock."""
    gap = statistics.median(w - e for w, e in zip(walls["stock"], events["stock"]))
    kernel = [max(e, w - gap) for e, w in zip(events["kernel"], walls["kernel"])]
    missed = statistics.median(k - e for k, e in zip(kernel, events["kernel"]))
    if missed * CALLS > SIDE_FLOOR and missed > SIDE_STREAM * statistics.median(kernel):
        caught.append(f"device-sync: {missed * 1e6:.1f} µs of each call's {statistics.median(kernel) * 1e6:.1f} µs "
                      "ran where the timing stream's events did not see it (another stream): charged to the kernel")
    return {"kernel": kernel, "stock": events["stock"]}, caught


def _cuda_lanes(model: Model, kernel: Kernel, rows: int, depth: int) -> list[KernelTiming]:
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(7)
    sets = _rotation(model, kernel.seam, rows, depth, gen)
    l2 = L2(model.embed_tokens.weight.device)
    work = kernel_ops.work(kernel.seam, *sets[0])
    timings = []
    for lane, timer in (("queued", "cuda events"), ("chained", "cuda graph replay")):  # a failed capture last
        samples, caught = _cuda_lane(lane, kernel, sets, gen, l2)
        if not samples:  # nothing timed in this lane: its guards say why
            timings.append(KernelTiming(kernel.seam, rows, depth, lane, float("nan"), float("nan"), timer,
                                        caught=tuple(caught)))
            continue
        timings.append(_timing(kernel.seam, rows, depth, lane, samples, f"{timer}, device-wide wall clock", work,
                               True, caught))
    return timings[::-1]


def _bound(fn: Any, args: Inputs, out: torch.Tensor) -> Timed:
    return lambda: fn(*args, out=out)


def _first_two(call: Timed, device: torch.device) -> tuple[float, float]:
    """Seconds of two calls in a row, each between device-wide synchronizations."""
    seconds = []
    for _ in range(2):
        synchronize(device)
        start = integrity.wall()
        call()
        synchronize(device)
        seconds.append(integrity.wall() - start)
    return seconds[0], seconds[1]


def _cold_lane(model: Model, kernel: Kernel, rows: int, depth: int) -> KernelTiming:
    """First and second call at COLD_SHAPES row counts drawn fresh (none the check's defaults nor `rows`)."""
    device = model.embed_tokens.weight.device
    counts = random.SystemRandom().sample([r for r in COLD_ROWS if r not in (1, 9, rows)], COLD_SHAPES)
    gen = torch.Generator(device=device).manual_seed(11)
    pairs: dict[str, list[tuple[float, float]]] = {"kernel": [], "stock": []}
    for count in counts:
        args = kernel_ops.inputs(model, kernel.seam, count, depth, gen)[0]
        for name, fn in (("kernel", kernel.fn), ("stock", kernel_ops.STOCK[kernel.seam])):
            pairs[name].append(_first_two(_bound(fn, args, kernel_ops.output(kernel.seam, args, poison=False)), device))
    caught = kernel_guards.cold(pairs["kernel"], pairs["stock"], [f"{count} rows" for count in counts])
    firsts = {name: [first for first, _ in found] for name, found in pairs.items()}
    return KernelTiming(kernel.seam, rows, depth, "cold", statistics.median(firsts["kernel"]),
                        statistics.median(firsts["stock"]), "first call at unseen row counts, device-wide wall clock",
                        tuple(firsts["kernel"]), tuple(firsts["stock"]), caught=(caught,) if caught else ())
