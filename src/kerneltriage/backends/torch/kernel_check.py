"""A custom kernel in isolation, at the model's real shapes: correctness against the stock op in float32 (fresh
random inputs every trial, the output poisoned before every call), then its time per call against stock's.

Timing lanes. CUDA: "chained" — calls captured back to back in a CUDA graph, each on the next of a rotation of
input sets (together larger than the L2, so the cache flatters neither side), replayed between events: the serial
launch-gap-free regime of a decode step; "queued" — the same calls launched eagerly back to back, many in flight.
CPU: both lanes are the same host-timed serial calls (said so in `timer`).
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch

from kerneltriage.backends.torch import kernel_ops
from kerneltriage.backends.torch.gates import event_seconds, graph_seconds
from kerneltriage.backends.torch.load import stock_copy
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.engine.kernels import Kernel
from kerneltriage.engine.probes import KernelCheck, KernelTiming

TRIALS = 3  # fresh random inputs per shape
FACTOR, FLOORS = 1.5, {torch.float32: 1e-5}  # error ≤ max(1.5 × stock's own error, floor of the dtype)
DEFAULT_FLOOR = 1e-3
L2_BYTES = 64 << 20  # rotate among input sets together at least this large (an H200's L2 is 60 MB)
CALLS, SAMPLES, WARMUPS, CPU_CALLS = 20, 5, 2, 5


def _relative(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference).abs().nan_to_num(float("inf")).max()
            / reference.abs().max().clamp_min(1e-30)).item()


def _upcast(args: tuple) -> tuple:
    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def _describe(args: tuple) -> str:
    return " ".join("x".join(map(str, a.shape)) if torch.is_tensor(a) else f"{a:g}" if isinstance(a, float) else str(a)
                    for a in args)


@torch.inference_mode()
def check(model: Model, kernel: Kernel, rows: Sequence[int], depths: Sequence[int]) -> list[KernelCheck]:
    """One row per (row count, depth, input shape): the kernel's worst error over TRIALS fresh inputs."""
    reference = stock_copy(model).float()
    stock = kernel_ops.STOCK[kernel.seam]
    found = []
    for count in rows:
        for depth in (depths if kernel.seam.startswith("attn") else (0,)):
            found += _check_at(model, reference, kernel, stock, count, depth)
    return found


def _check_at(model: Model, reference: Model, kernel: Kernel, stock: Any, rows: int, depth: int) -> list[KernelCheck]:
    worst: dict[str, list] = {}
    for trial in range(TRIALS):
        gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(1000 * rows + 10 * depth + trial)
        for args in kernel_ops.inputs(model, kernel.seam, rows, depth, gen):
            ref = stock(*_upcast(args), out=kernel_ops.output(kernel.seam, _upcast(args)))
            ours, base = kernel_ops.output(kernel.seam, args), kernel_ops.output(kernel.seam, args)
            kernel.fn(*args, out=ours)
            stock(*args, out=base)
            unwritten = int(ours.isnan().sum()) if ours.is_floating_point() else 0
            exact = bool(torch.equal(ours, base)) if kernel.exact else None
            seen = worst.setdefault(_describe(args), [0.0, 0.0, 0, None])
            seen[:] = [max(seen[0], _relative(ours, ref)), max(seen[1], _relative(base, ref)),
                       max(seen[2], unwritten), exact if seen[3] is None else seen[3] and bool(exact)]
    floor = FLOORS.get(model.embed_tokens.weight.dtype, DEFAULT_FLOOR)
    return [KernelCheck(kernel.seam, rows, depth, shape, error, stock_error, max(FACTOR * stock_error, floor),
                        unwritten, exact) for shape, (error, stock_error, unwritten, exact) in worst.items()]


@torch.inference_mode()
def time_lanes(model: Model, kernel: Kernel, rows: int, depth: int) -> list[KernelTiming]:
    """Seconds per call of kernel and stock in both lanes, on a rotation of input sets larger than the L2."""
    device = model.embed_tokens.weight.device
    sets = _rotation(model, kernel.seam, rows, depth, device)
    calls = {"kernel": kernel.fn, "stock": kernel_ops.STOCK[kernel.seam]}
    if device.type != "cuda":
        seconds = {name: _cpu_seconds(fn, sets) for name, fn in calls.items()}
        return [KernelTiming(kernel.seam, rows, depth, lane, seconds["kernel"], seconds["stock"], "cpu clock")
                for lane in ("chained", "queued")]
    timings = []
    for lane, timer in (("chained", graph_seconds), ("queued", event_seconds)):
        seconds = {name: timer(_cycle(fn, sets), CALLS, SAMPLES, WARMUPS) for name, fn in calls.items()}
        timings.append(KernelTiming(kernel.seam, rows, depth, lane, seconds["kernel"], seconds["stock"],
                                    "cuda graph replay" if lane == "chained" else "cuda events"))
    return timings


def _rotation(model: Model, seam: str, rows: int, depth: int, device: torch.device) -> list[tuple]:
    """Input sets (with their output buffers) for one shape, enough of them to exceed the L2 together."""
    gen = torch.Generator(device=device).manual_seed(7)
    first = kernel_ops.inputs(model, seam, rows, depth, gen)[0]
    size = sum(a.nbytes for a in first if torch.is_tensor(a)) or 1
    count = 1 if device.type != "cuda" else max(2, min(64, -(-L2_BYTES // size)))
    sets = [first] + [kernel_ops.inputs(model, seam, rows, depth, gen)[0] for _ in range(count - 1)]
    return [(args, kernel_ops.output(seam, args, poison=False)) for args in sets]


def _cycle(fn: Any, sets: list[tuple]) -> Any:
    """A call of `fn` on the next input set each time (the rotation is fixed at capture for graphs)."""
    state = {"i": 0}

    def call() -> Any:
        args, out = sets[state["i"] % len(sets)]
        state["i"] += 1
        return fn(*args, out=out)

    return call


def _cpu_seconds(fn: Any, sets: list[tuple]) -> float:
    call = _cycle(fn, sets)
    for _ in range(WARMUPS):
        call()
    samples = []
    for _ in range(SAMPLES):
        start = synced_clock(torch.device("cpu"))
        for _ in range(CPU_CALLS):
            call()
        samples.append((synced_clock(torch.device("cpu")) - start) / CPU_CALLS)
    return statistics.median(samples)
