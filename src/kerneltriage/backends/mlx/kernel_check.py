"""A custom kernel on MLX in isolation, at the model's real shapes, against the stock op in float32 (the torch
backend's `kernel_check.py` and `kernel_time.py` on MLX arrays), and its time per call beside the stock op's.

A kernel at a seam is `fn(*inputs) → array` (`kernel_lever.py` gives the signatures): composed `mx` ops, an
`mx.fast.metal_kernel` or an `mx.fast.cuda_kernel`. MLX arrays are values, so there is no output buffer to poison or
swap: an element a kernel leaves unwritten is whatever its output held (NaN counts as unwritten, anything else as
error). Each shape is checked on fresh random inputs, called twice (a result that moves between calls is judged by
its worse call). Attention at `attn.decode` is checked as both of its callers make it: the eager decode (the
filled keys, no mask) and a compiled step's (a WINDOW of a longer cache, strided, under its mask).

Timing lanes: "chained" (each call evaluated before the next: a decode step's dependency) and "queued" (CALLS
independent calls evaluated together), kernel and stock alternating, medians of SAMPLES, `mx.synchronize` around
the host clock.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import mlx.core as mx

from kerneltriage.backends.mlx.accelerate import WINDOW
from kerneltriage.backends.mlx.quant import QuantizedLinear
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.kernels import Kernel
from kerneltriage.engine.probes import KernelCheck, KernelTiming

FACTOR, FLOORS, DEFAULT_FLOOR = 1.5, {"float32": 1e-5}, 1e-3  # the torch check's bound: 1.5 × stock's own error
SAMPLES, CALLS, WARMUPS = 5, 10, 2
Inputs = tuple[Any, ...]


def _attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)


STOCK: dict[str, Callable[..., mx.array]] = {
    "norm": lambda x, weight, eps: mx.fast.rms_norm(x, weight, eps),
    "attn.decode": _attention, "attn.prefill": _attention,
    "lm_head": lambda hidden, weight: hidden @ weight.T,
}


def _causal(rows: int, keys: int, start: int) -> mx.array:
    return mx.arange(keys)[None, :] <= mx.arange(rows)[:, None] + start  # (T, S): query i sees keys ≤ start + i


def inputs(runner: Runner, seam: str, rows: int, depth: int, key: mx.array) -> list[Inputs]:
    """Fresh random inputs for `seam` at the model's shapes, one tuple per way the model calls it."""
    config, model, dtype = runner.config, runner.model, runner.mx_dtype
    keys = iter(mx.random.split(key, 8))
    normal = lambda *shape: mx.random.normal(shape, key=next(keys)).astype(dtype)  # noqa: E731
    hidden = normal(1, rows, config.hidden_size)
    if seam == "norm":
        norm = model.layers[0].input_layernorm
        return [(hidden, norm.weight, norm.eps)]
    if seam == "lm_head":
        if isinstance(model.lm_head, QuantizedLinear):
            raise InputError("a custom lm_head kernel takes a dense weight; this output head is quantized")
        return [(hidden[0], model.lm_head.weight)]
    filled, heads, kv_heads, dim = depth + rows, config.num_heads, config.num_kv_heads, config.head_dim
    q = normal(1, heads, rows, dim)  # (B, H, T, D)
    eager = (q, normal(1, kv_heads, filled, dim), normal(1, kv_heads, filled, dim),
             _causal(rows, filled, depth) if rows > 1 else None)
    if seam == "attn.prefill":
        return [eager]
    window = -(-filled // WINDOW) * WINDOW  # a compiled step's: slots of a longer cache, those past the rows masked
    cache_k, cache_v = normal(1, kv_heads, window + WINDOW, dim), normal(1, kv_heads, window + WINDOW, dim)
    return [eager, (q, cache_k[:, :, :window], cache_v[:, :, :window], _causal(rows, window, depth))]


def _float32(args: Inputs) -> Inputs:
    return tuple(a.astype(mx.float32) if isinstance(a, mx.array) and a.dtype != mx.bool_ else a for a in args)


def relative(out: mx.array, reference: mx.array) -> float:
    """max |out − reference| / max |reference|, an unwritten NaN infinitely far."""
    diff = mx.nan_to_num(mx.abs(out.astype(mx.float32) - reference), nan=float("inf"))
    return float((diff.max() / mx.maximum(mx.abs(reference).max(), 1e-30)).item())  # type: ignore[arg-type]


def _describe(args: Inputs) -> str:
    return " ".join("x".join(map(str, a.shape)) if isinstance(a, mx.array) else "None" if a is None else f"{a:g}"
                    for a in args)


def _check_one(kernel: Kernel, args: Inputs, rows: int, depth: int, dtype: str) -> KernelCheck:
    """The kernel called twice on the same inputs: the worse call's error (a result that moves between calls is as
    wrong as its worse call), against the bound stock's own error sets."""
    first, again = kernel.fn(*args), kernel.fn(*args)
    stock = STOCK[kernel.seam]
    reference, base = stock(*_float32(args)).astype(mx.float32), stock(*args)
    mx.eval(first, again, reference, base)
    error, stock_error = max(relative(first, reference), relative(again, reference)), relative(base, reference)
    tolerance = max(FACTOR * stock_error, FLOORS.get(dtype, DEFAULT_FLOOR))
    exact = bool(mx.array_equal(first, base).item() and mx.array_equal(again, base).item()) if kernel.exact else None
    unwritten = int(mx.isnan(first).sum().item())  # type: ignore[arg-type]
    return KernelCheck(kernel.seam, rows, depth, _describe(args), error, stock_error, tolerance, unwritten, exact)


def check(runner: Runner, kernel: Kernel, rows: Sequence[int], depths: Sequence[int]) -> list[KernelCheck]:
    """One row per (row count, depth, way of calling): the kernel's error against stock in float32."""
    attention = kernel.seam.startswith("attn")
    found = []
    for count in rows:
        for depth in (depths if attention else (0,)):
            key = mx.random.key(1000 * count + depth)
            found += [_check_one(kernel, args, count, depth, runner.dtype)
                      for args in inputs(runner, kernel.seam, count, depth, key)]
    return found


def _seconds(fn: Callable[..., mx.array], args: Inputs, chained: bool) -> float:
    mx.synchronize()
    start = time.perf_counter()
    if chained:
        for _ in range(CALLS):
            mx.eval(fn(*args))
    else:
        mx.eval([fn(*args) for _ in range(CALLS)])
    mx.synchronize()
    return (time.perf_counter() - start) / CALLS


def time_lanes(runner: Runner, kernel: Kernel, rows: int, depth: int) -> list[KernelTiming]:
    """Seconds per call of kernel and stock in each lane at (rows, depth), on the way the model calls it last
    (attn.decode: the compiled step's window)."""
    args = inputs(runner, kernel.seam, rows, depth, mx.random.key(7))[-1]
    stock = STOCK[kernel.seam]
    mx.eval(kernel.fn(*args), *[a for a in args if isinstance(a, mx.array)])
    timings = []
    for lane, chained in (("chained", True), ("queued", False)):
        samples: dict[str, list[float]] = {"kernel": [], "stock": []}
        for sample in range(WARMUPS + SAMPLES):
            for name, fn in (("kernel", kernel.fn), ("stock", stock)):
                seconds = _seconds(fn, args, chained)
                if sample >= WARMUPS:
                    samples[name].append(seconds)
        timings.append(KernelTiming(kernel.seam, rows, depth, lane, statistics.median(samples["kernel"]),
                                    statistics.median(samples["stock"]), "mx.synchronize + perf_counter"))
    return timings
