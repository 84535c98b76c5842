"""Planted cheating kernels for the `norm` seam, one per documented way of fooling a kernel benchmark
(docs/kernels.md, "Planted cheats", gives how each works, its public source and the guard that catches it). The tests
load them as `candidates.py:NAME`, the way a user's kernel is loaded. Cheats that act at import (rebinding the
judge's clocks or flags) live in files of their own (patch_*.py), CUDA-only ones in gpu_candidates.py.

Each is written to fool a judge that lacks the guard it is planted against: where it computes anything it computes
the right answer (`_norm`: RMSNorm in composite ops, no stock library call) unless getting it wrong is the cheat.
"""

from __future__ import annotations

import threading
import time
import weakref

import torch
import torch.nn.functional as F

from kerneltriage.engine.kernels import Kernel


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The stock op's arithmetic without its library call: x / rms(x) in float32, cast back, times the weight."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# --- timing -------------------------------------------------------------------------------------------------------

def background_thread(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Returns at once; a thread it starts does the work a little later (the timer stops before it)."""
    def work() -> None:
        time.sleep(0.005)
        with torch.inference_mode():
            out.copy_(_norm(x, weight, eps))

    threading.Thread(target=work, name="deferred-norm").start()


class _Lazy(torch.Tensor):
    """An output that computes itself the first time anything reads it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        for arg in (*args, *(kwargs or {}).values()):
            if type(arg) is _Lazy:
                arg.materialize()
        return super().__torch_function__(func, types, args, kwargs)

    def materialize(self) -> None:
        x, weight, eps = self.__dict__.pop("pending")
        self.__class__ = torch.Tensor
        with torch.inference_mode():
            self.copy_(_norm(x, weight, eps))


def lazy_output(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Turns the output buffer into a tensor that computes when read: the timed call does nothing."""
    out.__class__ = _Lazy
    out.__dict__["pending"] = (x.clone(), weight, eps)


_shapes: dict[tuple[int, ...], object] = {}


def compiled_per_shape(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Compiles a variant for every new shape (20 ms, as a Triton or torch.compile JIT does) and caches it: warm-ups
    pay the compile, the timed calls never do — a model that meets a new row count pays it every time."""
    if tuple(x.shape) not in _shapes:
        time.sleep(0.02)
        _shapes[tuple(x.shape)] = _norm
    out.copy_(_norm(x, weight, eps))


_timed: dict[str, object] = {"out": None, "calls": 0}


def skips_when_timed(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Right in every check (each call gets a new output buffer); once called into the same buffer again and again —
    a timing loop — it skips its work on the 5th call: one sample near 0 s, which takes a geometric mean to ~0."""
    same = _timed["out"] is not None and _timed["out"]() is out
    _timed["out"], _timed["calls"] = weakref.ref(out), (_timed["calls"] + 1 if same else 1)
    if _timed["calls"] == 5:
        return
    out.copy_(_norm(x, weight, eps))


_slow = {"calls": 0}


def bimodal(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Every other call takes a slow path (1 ms more): a best-of-N reports only the fast mode."""
    _slow["calls"] += 1
    if _slow["calls"] % 2:
        time.sleep(0.001)
    out.copy_(_norm(x, weight, eps))


# --- semantics ----------------------------------------------------------------------------------------------------

_previous: list[torch.Tensor] = []


def previous_output(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Returns the previous call's result (computing this one's for next time): right only when inputs repeat."""
    result = _norm(x, weight, eps)
    out.copy_(_previous[0] if _previous and _previous[0].shape == out.shape else result)
    _previous[:] = [result]


_by_pointer: dict[tuple[int, int], torch.Tensor] = {}


def cache_by_pointer(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Computes once per input address and replays it: a harness that reuses its input buffers is fooled."""
    key = (x.data_ptr(), tuple(x.shape))
    if key not in _by_pointer:
        _by_pointer[key] = _norm(x, weight, eps)
    out.copy_(_by_pointer[key])


_by_shape: dict[tuple[int, ...], torch.Tensor] = {}


def cache_by_shape(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Computes once per shape and replays it: a harness that times fixed inputs is fooled."""
    if tuple(x.shape) not in _by_shape:
        _by_shape[tuple(x.shape)] = _norm(x, weight, eps)
    out.copy_(_by_shape[tuple(x.shape)])


def uninitialized(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Writes nothing: the output buffer's uninitialized memory holds the reference's result when the harness
    computed the reference first and freed it (the "150×" kernel: right only in that order)."""


def half_precision(x, weight, eps, out):  # noqa: ANN001, ANN201
    """A float32 claim computed in float16 inside."""
    out.copy_(_norm(x.half(), weight.half(), eps).to(out.dtype))


def first_row_only(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Normalises the first row and copies it over the others: every element written, one row computed."""
    out.copy_(_norm(x[..., :1, :], weight, eps).expand_as(out))


def checked_shapes_only(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Right at the row counts a check is known to use (1, 9, 64), 5% off anywhere else."""
    out.copy_(_norm(x, weight, eps) * (1.0 if x.shape[-2] in (1, 9, 64) else 1.05))


def stock_call(x, weight, eps, out):  # noqa: ANN001, ANN201
    """The stock op itself, called through torch (benign, but no custom kernel)."""
    out.copy_(weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype))


_race = {"calls": 0}


def nondeterministic(x, weight, eps, out):  # noqa: ANN001, ANN201
    """A race that drops a partial sum on every third call (1% off one row): a single trial usually passes."""
    _race["calls"] += 1
    out.copy_(_norm(x, weight, eps))
    if _race["calls"] % 3 == 0:
        out[..., 0, :] *= 1.01


BACKGROUND_THREAD = Kernel("norm", background_thread)
LAZY_OUTPUT = Kernel("norm", lazy_output)
COMPILED_PER_SHAPE = Kernel("norm", compiled_per_shape)
SKIPS_WHEN_TIMED = Kernel("norm", skips_when_timed)
BIMODAL = Kernel("norm", bimodal)
PREVIOUS_OUTPUT = Kernel("norm", previous_output)
CACHE_BY_POINTER = Kernel("norm", cache_by_pointer)
CACHE_BY_SHAPE = Kernel("norm", cache_by_shape)
UNINITIALIZED = Kernel("norm", uninitialized)
HALF_PRECISION = Kernel("norm", half_precision)
FIRST_ROW_ONLY = Kernel("norm", first_row_only)
CHECKED_SHAPES_ONLY = Kernel("norm", checked_shapes_only)
STOCK_CALL = Kernel("norm", stock_call)
NONDETERMINISTIC = Kernel("norm", nondeterministic)
HONEST = Kernel("norm", lambda x, weight, eps, out: out.copy_(_norm(x, weight, eps)))
