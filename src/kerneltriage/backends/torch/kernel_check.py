"""A custom kernel in isolation, at the model's real shapes, against the stock op in float32 — under guards against
the documented ways a kernel fools its judge (docs/kernels.md, "Planted cheats"). Timing: kernel_time.py.

Each recorded shape gets two trials, each on inputs no stock op has computed on yet, the kernel called first (no
memory can hold a reference result for it to read: the "150×" kernel returned the result the harness had computed
just before it):
- fresh-inputs: new tensors holding new random values;
- same-pointers: new values written into the first trial's tensors (a result cached by input pointer is stale),
  called REPEATS times; each call against the reference and the later ones against the first (repeat:
  non-determinism that passes one call).
UNSEEN more shapes are drawn at random for every check and recorded nowhere beforehand (unseen-shape: a kernel right
only where it knows it is checked). The calls per shape are those of the check before these guards (three).

Every call: the output is poisoned with NaN before it (an element left unwritten shows); after it, the output's type,
storage and layout must be unchanged (output-swapped: a lazy tensor subclass that computes when read); its contents
are read as the call returns (the calling stream synchronized) and again once the threads the call started have
finished and the whole device has synchronized (outlived-call: work left on a side stream; background-thread: work
left to a thread). The bound: FACTOR × the stock op's own error in the run dtype, at least the dtype's floor.

The first call is recorded at the torch-function level: a kernel that calls the stock op's own library function
(kernel_ops.STOCK_CORE) is labelled stock-call — not a failure, but no custom kernel either.
"""

from __future__ import annotations

import contextlib
import random
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch
from torch.overrides import TorchFunctionMode

from kerneltriage.backends.torch import kernel_ops
from kerneltriage.backends.torch.kernel_ops import FACTOR, Inputs, floor, relative, upcast
from kerneltriage.backends.torch.kernel_time import time_lanes  # noqa: F401  (the backend's entry point for timing)
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.timing import synchronize
from kerneltriage.engine.kernels import Kernel
from kerneltriage.engine.probes import KernelCheck

TRIALS = ("fresh-inputs", "same-pointers")
REPEATS = 2  # calls on the same inputs in the same-pointers trial: the second is the repeat
UNSEEN = 1  # shapes drawn at random per check
JOIN_SECONDS = 2.0  # how long a thread the call started is waited for before its output is read again


@dataclass
class _Worst:
    """The worst a kernel did at one shape over its trials."""

    error: float = 0.0
    stock_error: float = 0.0
    unwritten: int = 0
    exact: bool | None = None
    trial: str = TRIALS[0]  # the first trial that failed, else the one of the worst error
    failed: bool = False
    caught: list[str] = field(default_factory=list)


def _describe(args: tuple) -> str:
    return " ".join("x".join(map(str, a.shape)) if torch.is_tensor(a) else f"{a:g}" if isinstance(a, float) else str(a)
                    for a in args)


@torch.inference_mode()
def check(model: Model, kernel: Kernel, rows: Sequence[int], depths: Sequence[int]) -> list[KernelCheck]:
    """One row per (row count, depth, input shape) recorded or drawn: the kernel's worst error over its trials and
    the guards that fired there; the first row carries the stock-call label when it applies."""
    attention = kernel.seam.startswith("attn")
    shapes = [(count, depth) for count in rows for depth in (depths if attention else (0,))]
    called = _Called()
    found = [c for i, (count, depth) in enumerate(shapes)
             for c in _check_at(model, kernel, count, depth, TRIALS, called if i == 0 else None)]
    found += [c for count, depth in unseen(rows, depths if attention else ())
              for c in _check_at(model, kernel, count, depth, ("unseen-shape",))]
    label = called.stock_call(kernel.seam)
    return [replace(found[0], labels=(label,))] + found[1:] if label else found


def unseen(rows: Sequence[int], depths: Sequence[int]) -> list[tuple[int, int]]:
    """UNSEEN (rows, depth) drawn from the OS's entropy (a candidate cannot predict them), none recorded."""
    draw = random.SystemRandom()
    counts = draw.sample([r for r in range(2, max(max(rows), 8) + 1) if r not in rows], UNSEEN)
    if not depths:
        return [(count, 0) for count in counts]
    pool = [d for d in range(1, max(max(depths), 8) + 1) if d not in depths]
    return [(count, draw.choice(pool)) for count in counts]


def _check_at(model: Model, kernel: Kernel, rows: int, depth: int, trials: Sequence[str],
              called: _Called | None = None) -> list[KernelCheck]:
    worst: dict[str, _Worst] = {}
    previous: list[Inputs] = []
    fresh = lambda: _Worst(trial=trials[0])  # noqa: E731
    device = model.embed_tokens.weight.device
    for i, trial in enumerate(trials):
        gen = torch.Generator(device=device).manual_seed(1000 * rows + 10 * depth + i)
        sets = ([kernel_ops.refill(kernel.seam, args, gen) for args in previous] if trial == "same-pointers"
                else kernel_ops.inputs(model, kernel.seam, rows, depth, gen))
        for args in sets:
            _trial(kernel, args, trial, worst.setdefault(_describe(args), fresh()), called)
            called = None  # one call recorded
        previous = sets
    dtype = model.embed_tokens.weight.dtype
    return [KernelCheck(kernel.seam, rows, depth, shape, w.error, w.stock_error,
                        max(FACTOR * w.stock_error, floor(dtype)), w.unwritten, w.exact, w.trial,
                        tuple(dict.fromkeys(w.caught)), dtype=str(dtype).removeprefix("torch."))
            for shape, w in worst.items()]


def _trial(kernel: Kernel, args: Inputs, trial: str, seen: _Worst, called: _Called | None) -> None:
    """The kernel's calls on `args` (before anything else computes on them), then the stock op's, compared."""
    calls = [guarded_call(kernel, args, called if i == 0 else None)
             for i in range(REPEATS if trial == "same-pointers" else 1)]
    outs = [out for out, _ in calls]
    stock = kernel_ops.STOCK[kernel.seam]
    reference = stock(*upcast(args), out=kernel_ops.output(kernel.seam, upcast(args)))
    base = stock(*args, out=kernel_ops.output(kernel.seam, args))
    error, stock_error = max(relative(out, reference) for out in outs), relative(base, reference)
    if error > max(FACTOR * stock_error, floor(args[0].dtype)) and not seen.failed:
        seen.failed, seen.trial = True, trial  # the first trial that fails names the guard that caught it
    if error > seen.error:
        seen.error, seen.trial = error, (seen.trial if seen.failed else trial)
    seen.stock_error = max(seen.stock_error, stock_error)
    seen.unwritten = max([seen.unwritten] + [int(o.isnan().sum()) for o in outs
                                             if o is not None and o.is_floating_point()])
    if kernel.exact:
        seen.exact = (seen.exact is not False) and all(o is not None and torch.equal(o, base) for o in outs)
    seen.caught += [message for _, fired in calls for message in fired]
    drift = _drift(outs)
    if drift > max(FACTOR * stock_error, floor(args[0].dtype)):
        seen.caught.append(f"repeat: {len(outs)} calls on the same inputs disagree (by {drift:.1e} relative): a "
                           "non-deterministic result that one call would pass")


def _drift(outs: list[torch.Tensor | None]) -> float:
    """How far repeated calls' outputs are from the first's (elements left unwritten in both compare equal)."""
    found = [out.nan_to_num(0.0) for out in outs if out is not None]
    if len(found) < 2 or len(found) < len(outs):
        return 0.0
    return max(relative(out, found[0].float()) for out in found[1:])


def _layout(out: torch.Tensor) -> tuple:
    if type(out) is not torch.Tensor:  # checked first: a subclass's methods would run its own code
        return (type(out),)
    return type(out), out.data_ptr(), tuple(out.shape), out.stride(), out.storage_offset(), out.dtype


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def guarded_call(kernel: Kernel, args: Inputs, called: _Called | None = None
                 ) -> tuple[torch.Tensor | None, list[str]]:
    """One call into a poisoned output (recorded by `called`, if given): (the output as the call returned it, or None
    when the buffer itself was swapped; the guards that fired)."""
    out = kernel_ops.output(kernel.seam, args)
    layout, before = _layout(out), set(threading.enumerate())
    with called if called is not None else contextlib.nullcontext():
        kernel.fn(*args, out=out)
    if _layout(out) != layout:
        return None, [f"output-swapped: the output buffer came back as {type(out).__name__} (or on other storage, "
                      "shape or strides): a result computed when read, not by the call"]
    if out.device.type == "cuda":
        torch.cuda.current_stream(out.device).synchronize()  # the calling stream only: not a side stream
    returned = out.clone()
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:
        thread.join(JOIN_SECONDS)
    synchronize(out.device)  # device-wide
    if _same(out, returned):
        return returned, []
    if started:
        return returned, [f"background-thread: the output changed after the call returned, written by "
                          f"{len(started)} thread(s) the call started ({started[0].name})"]
    return returned, ["outlived-call: the output changed after the call returned and its stream had finished: "
                      "work left running outside the calling stream (a side stream)"]


class _Called(TorchFunctionMode):
    """The names of the torch functions called inside the mode (a dispatch mode would cost an import of dynamo)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))

    def stock_call(self, seam: str) -> str | None:
        """The stock-call label when the recorded call called the stock op's own library function."""
        found = sorted(self.names & kernel_ops.STOCK_CORE[seam])
        if not found:
            return None
        return (f"stock-call: the kernel calls {', '.join(found)}, the stock op's own library function: it is the "
                "stock op under another name, not a custom kernel")
