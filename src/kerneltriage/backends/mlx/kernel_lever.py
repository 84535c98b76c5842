"""The `kernel=REF` lever on MLX: a custom kernel installed at the seam it declares, counting its calls.

A kernel is any callable on MLX arrays: composed `mx` ops, an `mx.fast.metal_kernel` (Metal only) or an
`mx.fast.cuda_kernel` (MLX's CUDA backend only; `kernels/mlx_masked_decode.py` is one). Installing one runs it once
at the model's shapes, so a kernel for another device is refused at once, in MLX's own words ("[metal_kernel] No
Metal back-end", "[cuda_kernel] No CUDA back-end"), not mid-benchmark; `kernel check` and `kernel run` on MLX make
the same call first (`kernel_check.py`).

Signatures at each wired seam (the stock op's, as on torch):
- `norm`: fn(x (..., D), weight (D,), eps) → (..., D)
- `attn.decode`: fn(q (B,H,T,D), k (B,Hkv,S,D), v (B,Hkv,S,D), mask (T, S) bool or None) → (B,H,T,D), for
  decode steps (T = 1) and verifies under a static cache (T ≤ 16); `attn.prefill` the same for the other calls
- `lm_head`: fn(hidden (..., hidden), weight (V, hidden)) → (..., V)
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from kerneltriage.backends.mlx import counting
from kerneltriage.backends.mlx.models.llama import RMSNorm
from kerneltriage.backends.mlx.quant import QuantizedLinear
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.kernels import Kernel, load_kernel, seam_attention

PROBE_KEYS = 8  # keys of the one call that checks a kernel runs here


class KernelNorm(nn.Module):
    """An RMSNorm whose arithmetic is the kernel's: fn(x, weight, eps)."""

    def __init__(self, norm: RMSNorm, fn: Callable) -> None:
        super().__init__()
        self.weight, self.eps, self.fn = norm.weight, norm.eps, fn

    def __call__(self, x: mx.array) -> mx.array:
        return self.fn(x, self.weight, self.eps)


def _norm(runner: Runner, fn: Callable) -> None:
    model = runner.model
    model.update_modules(tree_unflatten([(name, KernelNorm(module, fn)) for name, module in model.named_modules()
                                         if isinstance(module, RMSNorm)]))


def _attention(runner: Runner, fn: Callable, decode: bool) -> None:
    def causal(rows: int, keys: int, start: int) -> mx.array:
        return mx.arange(keys)[None, :] <= mx.arange(rows)[:, None] + start  # (T, S)

    runner.model.attention = seam_attention(runner.model.attention, fn, decode, causal)


def _lm_head(runner: Runner, fn: Callable) -> None:
    model = runner.model
    model.logits = lambda hidden: fn(hidden, model.lm_head.weight)


def probe_args(runner: Runner, seam: str) -> tuple:
    """One call's arguments at the model's shapes (random values): the check that a kernel runs here."""
    config, model = runner.config, runner.model
    if seam == "norm":
        return mx.random.normal((1, 1, config.hidden_size)), mx.ones((config.hidden_size,)), config.rms_eps
    if seam == "lm_head":
        if isinstance(model.lm_head, QuantizedLinear):
            raise InputError("a custom lm_head kernel takes a dense weight; the output head here is quantized "
                             "(--levers quantized)")
        return mx.random.normal((1, config.hidden_size)), model.lm_head.weight
    q = mx.random.normal((1, config.num_heads, 1, config.head_dim))  # (B, H, T, D)
    k = mx.random.normal((1, config.num_kv_heads, PROBE_KEYS, config.head_dim))  # (B, Hkv, S, D)
    return q, k, k, None


def _counted(runner: Runner, lever: str, fn: Callable) -> Callable:
    def call(*args: Any) -> Any:
        counting.ran(runner, lever)
        return fn(*args)

    return call


WIRED = {"norm": _norm, "attn.decode": lambda r, f: _attention(r, f, True),
         "attn.prefill": lambda r, f: _attention(r, f, False), "lm_head": _lm_head}


def install(runner: Runner, ref: str | None) -> None:
    """Load the kernel named by `ref`, put it at its seam and run it once there; a seam not wired on MLX, or a
    kernel that does not run on this device, is an InputError."""
    kernel = runnable(runner, ref or "")
    WIRED[kernel.seam](runner, _counted(runner, f"kernel={ref}", kernel.fn))
    if kernel.quality is not None:
        runner.approximations.append(kernel.quality)


def runnable(runner: Runner, ref: str) -> Kernel:
    """The kernel `ref` at a seam MLX wires, run once at the model's shapes; an InputError where it cannot run."""
    kernel: Kernel = load_kernel(ref)
    if kernel.seam not in WIRED:
        raise InputError(f"kernel={ref}: seam {kernel.seam} takes no custom kernel on MLX yet; "
                         f"expected one of {', '.join(WIRED)}")
    if kernel.seam not in runner.model.SEAMS:
        raise InputError(f"kernel={ref}: a {runner.config.arch} model has no {kernel.seam} seam")
    try:
        args = probe_args(runner, kernel.seam)
    except InputError as exc:
        raise InputError(f"kernel={ref}: {exc}") from None
    try:
        mx.eval(kernel.fn(*args))
    except (RuntimeError, ValueError) as exc:
        raise InputError(f"kernel={ref}: does not run on MLX's {runner.device_type} device here ({exc})") from None
    return kernel
