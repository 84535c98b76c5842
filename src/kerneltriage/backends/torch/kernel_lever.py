"""The `kernel=REF` lever on torch: a custom kernel installed at the seam it declares, counting its calls.

Signatures at each wired seam (the stock op's, so the stock function is a valid kernel):
- `norm`: fn(x (..., D), weight (D,), eps) → (..., D)
- `attn.decode`: fn(q (B,H,T,D), k (B,Hkv,S,D), v (B,Hkv,S,D), mask (T, S) bool or None) → (B,H,T,D), for
  decode steps (T = 1) and verifies under a static cache (T ≤ 16); `attn.prefill` the same for the other calls
- `lm_head`: fn(hidden (..., hidden), weight (V, hidden)) → (..., V)
"""

from __future__ import annotations

from typing import Any

import torch

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.models.llama import SDPA, RMSNorm
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.kernels import Kernel, load_kernel

DECODE_ROWS = 16  # query rows up to which a masked call is a decode-path call (a verify), as in flex_decode


def _norm(runner: Runner, kernel: Kernel, lever: str) -> None:
    for module in runner.model.modules():
        if isinstance(module, RMSNorm):
            module.forward = lambda x, m=module: _counted(runner, lever, kernel.fn)(x, m.weight, m.eps)


def _attention(runner: Runner, kernel: Kernel, lever: str) -> None:
    inner, decode = runner.model.attention, kernel.seam == "attn.decode"

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: Any, sdpa: Any = SDPA) -> torch.Tensor:
        rows = q.shape[2]
        if (rows == 1 if pos.mask is None else rows <= DECODE_ROWS) != decode:
            return inner(q, k, v, pos, sdpa=sdpa)
        mask = pos.mask
        if mask is None and rows > 1:  # eager rows after `start` cached positions (0 for a fresh prompt)
            mask = _causal_block(rows, k.shape[2], pos.start, q.device)
        return _counted(runner, lever, kernel.fn)(q, k, v, mask)

    runner.model.attention = attention


def _causal_block(rows: int, keys: int, start: int, device: torch.device) -> torch.Tensor:
    """(T, S) bool: query i sees keys ≤ start + i."""
    return torch.arange(keys, device=device).unsqueeze(0) <= (torch.arange(rows, device=device).unsqueeze(1) + start)


def _lm_head(runner: Runner, kernel: Kernel, lever: str) -> None:
    model = runner.model
    model.logits = lambda hidden: _counted(runner, lever, kernel.fn)(hidden, model.lm_head.weight)


def _counted(runner: Runner, lever: str, fn: Any) -> Any:
    def call(*args: Any) -> Any:
        counting.ran(runner, lever)
        return fn(*args)

    return call


WIRED = {"norm": _norm, "attn.decode": _attention, "attn.prefill": _attention, "lm_head": _lm_head}


def install(runner: Runner, ref: str | None) -> None:
    """Load the kernel named by `ref` and put it at its seam; a seam not wired on torch is an InputError."""
    kernel = load_kernel(ref or "")
    if kernel.seam not in WIRED:
        raise InputError(f"kernel={ref}: seam {kernel.seam} takes no custom kernel on torch yet; "
                         f"expected one of {', '.join(WIRED)}")
    if kernel.seam not in runner.model.SEAMS:
        raise InputError(f"kernel={ref}: a {runner.config.arch} model has no {kernel.seam} seam")
    WIRED[kernel.seam](runner, kernel, f"kernel={ref}")
