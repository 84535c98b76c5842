"""RMSNorm as one kernel per row, the `norm` seam: normalised in float32, cast to the activation dtype, times the
weight — the stock op's arithmetic (three or four kernels under eager torch: cast, normalise, cast, multiply).

Why: a decode step of the default model runs 61 norms; fused by `compile` already, but not under `graphs` alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerneltriage.engine.kernels import Kernel


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, sx, so, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    ok = d < dim
    x = tl.load(x_ptr + row * sx + d, mask=ok, other=0.0).to(tl.float32)
    rms = tl.rsqrt(tl.sum(x * x, 0) / dim + eps)
    normed = (x * rms).to(out_ptr.dtype.element_ty)  # rounded to the activation dtype, as the stock op does
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    tl.store(out_ptr + row * so + d, (normed.to(tl.float32) * w.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    """x (..., D) → out (..., D); the rows of x (and out) are contiguous in their last dimension."""
    rows = x.reshape(-1, x.shape[-1])
    target = out.view(-1, out.shape[-1])
    _rmsnorm[(rows.shape[0],)](rows, weight, target, rows.stride(0), target.stride(0), x.shape[-1], eps,
                               BLOCK=triton.next_power_of_2(x.shape[-1]))
    return out


RMSNORM = Kernel("norm", rmsnorm, name="rmsnorm")
