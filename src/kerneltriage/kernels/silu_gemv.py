"""gate and up projections with SiLU·mul in the epilogue, the `gate_up` seam, for decode and verify rows (≤ 16):
each program reads its block of both weights' rows once and writes SiLU(x·Wgᵀ)·(x·Wuᵀ) — the two GEMVs, the SiLU
and the product are one kernel instead of three or four, and the (T, I) intermediates never reach memory.
Prompts (more rows) take the stock ops: there a GEMM is compute-bound and cuBLAS is the fast path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kerneltriage.engine.kernels import GEMV_ROWS, Kernel

BLOCK_N, BLOCK_K = 64, 64
ROWS_MIN = 16  # tl.dot wants at least 16 rows: fewer are padded (masked loads)


@triton.jit
def _silu_gemv(x_ptr, wg_ptr, wu_ptr, out_ptr, rows, n, k, sx, sw, so,
               ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    block = tl.program_id(0)
    r = tl.arange(0, ROWS)
    cols = block * BN + tl.arange(0, BN)
    r_ok, n_ok = r < rows, cols < n
    gate = tl.zeros((ROWS, BN), tl.float32)
    up = tl.zeros((ROWS, BN), tl.float32)
    k0 = 0
    while k0 < k:
        kk = k0 + tl.arange(0, BK)
        k_ok = kk < k
        x = tl.load(x_ptr + r[:, None] * sx + kk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)  # (R, BK)
        w_mask = n_ok[:, None] & k_ok[None, :]
        wg = tl.load(wg_ptr + cols[:, None] * sw + kk[None, :], mask=w_mask, other=0.0)  # (BN, BK)
        wu = tl.load(wu_ptr + cols[:, None] * sw + kk[None, :], mask=w_mask, other=0.0)
        gate += tl.dot(x, tl.trans(wg), input_precision="ieee")  # float32 stays float32 (the default is TF32)
        up += tl.dot(x, tl.trans(wu), input_precision="ieee")
        k0 += BK
    act = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)  # SiLU rounded as stock rounds it
    result = act * up.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + r[:, None] * so + cols[None, :], result.to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & n_ok[None, :])


def silu_gemv(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """x (B, T, H), w_gate and w_up (I, H) → out (B, T, I) = SiLU(x w_gateᵀ) · (x w_upᵀ)."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > GEMV_ROWS:
        return out.copy_(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up))
    target = out.view(-1, out.shape[-1])
    n, k = w_gate.shape
    _silu_gemv[(triton.cdiv(n, BLOCK_N),)](rows, w_gate, w_up, target, rows.shape[0], n, k, rows.stride(0),
                                           w_gate.stride(0), target.stride(0), ROWS=ROWS_MIN, BN=BLOCK_N, BK=BLOCK_K)
    return out


SILU_GEMV = Kernel("gate_up", silu_gemv, name="silu_gemv")
