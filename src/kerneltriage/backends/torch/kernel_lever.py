"""The `kernel=REF` lever on torch: a custom kernel installed at the seam it declares, called with the stock op's
inputs and an output buffer (`engine/kernels.py` SEAM_INPUTS), counting its calls (per replay under graphs)."""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import triton
from torch import nn
from triton.runtime.interpreter import InterpretedFunction

from kerneltriage.backends.torch import counting, kernel_ops
from kerneltriage.backends.torch.device import runs_triton
from kerneltriage.backends.torch.models.llama import MLP, RMSNorm
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.kernels import GEMV_ROWS, READS_PROJECTIONS, Kernel, load_kernel, seam_attention



def _call(runner: Runner, lever: str, kernel: Kernel, seam: str) -> Callable[..., torch.Tensor]:
    """The kernel as the model calls it: an output buffer allocated, the call counted."""

    def call(*args: Any) -> torch.Tensor:
        counting.ran(runner, lever)
        out = kernel_ops.output(seam, args, poison=False)
        kernel.fn(*args, out=out)
        return out

    return call


def _norm(runner: Runner, call: Callable) -> None:
    for module in runner.model.modules():
        if isinstance(module, RMSNorm):
            module.forward = lambda x, m=module: call(x, m.weight, m.eps)


def _gate_up(runner: Runner, call: Callable) -> None:
    for module in runner.model.modules():
        if isinstance(module, MLP):
            module.act = lambda x, m=module: call(x, m.gate_proj.weight, m.up_proj.weight)


def _attention(runner: Runner, call: Callable, decode: bool) -> None:
    def causal(rows: int, keys: int, start: int) -> torch.Tensor:
        return kernel_ops.causal(rows, keys, runner.device)  # keys = start + rows: the eager cache's

    runner.model.attention = seam_attention(runner.model.attention, call, decode, causal)


def _lm_head(runner: Runner, call: Callable) -> None:
    model = runner.model
    model.logits = lambda hidden: call(hidden.reshape(-1, hidden.shape[-1]), model.lm_head.weight).view(
        *hidden.shape[:-1], -1)


def _gemv(runner: Runner, call: Callable) -> None:
    for module in runner.model.modules():
        if isinstance(module, nn.Linear):
            module.forward = lambda x, m=module, stock=module.forward: _gemv_forward(m, stock, call, x)


def _gemv_forward(module: nn.Linear, stock: Callable, call: Callable, x: torch.Tensor) -> torch.Tensor:
    rows = x.shape[:-1].numel()
    if rows > GEMV_ROWS:
        return stock(x)
    out = call(x.reshape(rows, x.shape[-1]), module.weight).view(*x.shape[:-1], -1)
    return out if module.bias is None else out + module.bias


WIRED = {"norm": _norm, "gate_up": _gate_up, "attn.decode": lambda r, c: _attention(r, c, True),
         "attn.prefill": lambda r, c: _attention(r, c, False), "lm_head": _lm_head, "linear.gemv": _gemv}


def install(runner: Runner, ref: str | None) -> Kernel:
    """Load the kernel named by `ref` and put it at its seam; a seam not wired on torch is an InputError."""
    kernel = load_kernel(ref or "")
    if kernel.seam not in WIRED:
        raise InputError(f"kernel={ref}: seam {kernel.seam} takes no custom kernel on torch yet; "
                         f"expected one of {', '.join(WIRED)}")
    if kernel.seam not in runner.model.SEAMS:
        raise InputError(f"kernel={ref}: a {runner.config.arch} model has no {kernel.seam} seam")
    if kernel.seam in READS_PROJECTIONS and runner.run_config.has("quantized"):
        others = ", ".join(sorted(set(WIRED) - READS_PROJECTIONS))
        raise InputError(f"kernel={ref}: seam {kernel.seam} reads the projections' weights, which quantized keeps "
                         f"as blocks; expected a seam that reads none ({others})")
    if not runs_triton(runner.device) and _is_triton(kernel):
        raise InputError(f"kernel={ref}: a Triton kernel, and Triton has no backend for {runner.device}; expected "
                         "--device cuda (or TRITON_INTERPRET=1: Triton's interpreter, slow)")
    WIRED[kernel.seam](runner, _call(runner, f"kernel={ref}", kernel, kernel.seam))
    if kernel.quality is not None:
        runner.approximations.append(kernel.quality)
    return kernel


def _is_triton(kernel: Kernel) -> bool:
    """The kernel's module defines a Triton JIT function (on the CPU without the interpreter Triton finds no
    driver at the first launch: a traceback mid-run, not an error naming the input)."""
    module = sys.modules.get(getattr(kernel.fn, "__module__", ""))
    kinds = (triton.runtime.JITFunction, InterpretedFunction)  # the latter: decorated under TRITON_INTERPRET=1
    return any(isinstance(value, kinds) for value in vars(module or object).values())
