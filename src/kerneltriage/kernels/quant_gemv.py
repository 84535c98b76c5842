"""GEMV over weights kept as GGUF Q4_0 / Q4_1 / Q8_0 blocks (the `quantized` lever on torch): for decode and verify
rows (≤ 16) each program reads 4.5–8.5 bits per weight instead of the dequantized 16 and dequantizes in registers,
float32 sums. Deletes work where decode is bandwidth-bound (an 8B model reads ~3.5× fewer weight bytes per token).

The blocks are split at load into three arrays (structure of arrays, the bytes unchanged): `scales` (N, K/32) fp16,
`mins` (N, K/32) fp16 (Q4_1's m; absent otherwise) and `quants` — Q4: (N, K/2) uint8, each block's 16 bytes holding
its values 0..15 in the low nibbles and 16..31 in the high ones; Q8_0: (N, K) int8. A value is d·(q − 8) (Q4_0),
d·q + m (Q4_1) or d·q (Q8_0), in float32 as llama.cpp's reference dequantization computes it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from kerneltriage.engine.checkpoint import RawTensor

BLOCK = 32  # values per block
GEMV_ROWS = 16  # decode and verify rows (a padded auto-depth verify: 16 from a lookup, 9 from a model); prompts
# dequantize and take cuBLAS
BN = 8  # output rows per program
TILE = 1024  # rows × values multiplied per output row and loop step: blocks per step = TILE / 32 / padded rows
KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2}
_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


class QuantWeight(NamedTuple):
    qtype: str
    scales: torch.Tensor  # (N, K/32) float16
    mins: torch.Tensor | None  # (N, K/32) float16, Q4_1 only
    quants: torch.Tensor  # (N, K/2) uint8 for Q4_*, (N, K) int8 for Q8_0
    shape: tuple[int, int]  # (N, K)


def split_blocks(raw: RawTensor, device: torch.device | str) -> QuantWeight:
    """A stored Q4_0/Q4_1/Q8_0 tensor (rows of blocks) as scales, mins and quants on `device`."""
    if raw.qtype not in KINDS:
        raise ValueError(f"tensor type {raw.qtype}: expected one of {', '.join(KINDS)}")
    n, k = raw.shape
    blocks = np.ascontiguousarray(raw.data).reshape(n, k // BLOCK, _BYTES[raw.qtype])
    scales = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).reshape(n, -1))
    mins = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).reshape(n, -1)) \
        if raw.qtype == "Q4_1" else None
    first = 4 if raw.qtype == "Q4_1" else 2
    quants = np.ascontiguousarray(blocks[:, :, first:]).reshape(n, -1)
    quants = torch.from_numpy(quants.view(np.int8) if raw.qtype == "Q8_0" else quants)
    return QuantWeight(raw.qtype, scales.to(device), None if mins is None else mins.to(device), quants.to(device),
                       (n, k))


def dequantized(w: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """The weight's values (N, K) as `dtype` (prompts: dequantize, then a GEMM)."""
    n, k = w.shape
    d = w.scales.float().unsqueeze(-1)  # (N, K/32, 1)
    if w.qtype == "Q8_0":
        return (w.quants.view(n, -1, BLOCK).float() * d).reshape(n, k).to(dtype)
    q = w.quants.view(n, -1, BLOCK // 2)
    q = torch.cat([q & 0x0F, q >> 4], dim=-1).float()  # (N, K/32, 32): low nibbles are values 0..15
    values = d * q + w.mins.float().unsqueeze(-1) if w.qtype == "Q4_1" else d * (q - 8)
    return values.reshape(n, k).to(dtype)


@triton.jit
def _quant_gemv(x_ptr, scale_ptr, min_ptr, q_ptr, out_ptr, rows, n, nblocks, sx, so,
                KIND: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr):
    """BN output rows a program; each step reads BB blocks of each as their bytes, once (a Q4 byte holds a block's
    values j and j + 16, so the low and high nibbles meet their two halves of x), sums each block and scales the
    sum once (Q4_1: d·q + m per value, whose sum would cancel if taken apart)."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)  # output rows of W
    n_ok = cols < n
    r = tl.arange(0, ROWS)
    r_ok = r < rows
    WIDTH: tl.constexpr = 32 if KIND == 2 else 16  # bytes of one block's quants
    j = tl.arange(0, WIDTH)
    acc = tl.zeros((ROWS, BN), tl.float32)
    b0 = 0
    while b0 < nblocks:  # (a while: Triton's interpreter takes no range over a runtime bound)
        blocks = b0 + tl.arange(0, BB)
        b_ok = blocks < nblocks
        ok = n_ok[:, None] & b_ok[None, :]  # (BN, BB)
        d = tl.load(scale_ptr + cols[:, None] * nblocks + blocks[None, :], mask=ok, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + cols[:, None, None] * (nblocks * WIDTH) + (blocks[:, None] * WIDTH + j[None, :])[None],
                    mask=ok[:, :, None], other=0)  # (BN, BB, WIDTH)
        at = r[:, None, None] * sx + (blocks[:, None] * 32 + j[None, :])[None]  # (ROWS, BB, WIDTH): x's values
        x_ok = r_ok[:, None, None] & b_ok[None, :, None]
        x = tl.load(x_ptr + at, mask=x_ok, other=0.0).to(tl.float32)
        if KIND == 2:
            summed = tl.sum(x[:, None] * q.to(tl.float32)[None], axis=3)  # (ROWS, BN, BB)
            acc += tl.sum(summed * d[None], axis=2)
        else:
            x_high = tl.load(x_ptr + at + 16, mask=x_ok, other=0.0).to(tl.float32)  # values 16..31 of each block
            low, high = (q & 0x0F).to(tl.float32), (q >> 4).to(tl.float32)
            if KIND == 1:
                m = tl.load(min_ptr + cols[:, None] * nblocks + blocks[None, :], mask=ok, other=0.0).to(tl.float32)
                w_low = d[:, :, None] * low + m[:, :, None]
                w_high = d[:, :, None] * high + m[:, :, None]
                acc += tl.sum(tl.sum(x[:, None] * w_low[None] + x_high[:, None] * w_high[None], axis=3), axis=2)
            else:
                summed = tl.sum(x[:, None] * (low - 8.0)[None] + x_high[:, None] * (high - 8.0)[None], axis=3)
                acc += tl.sum(summed * d[None], axis=2)
        b0 += BB
    tl.store(out_ptr + r[:, None] * so + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & n_ok[None, :])


def quant_gemv(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x (M, K), M ≤ GEMV_ROWS → x·Wᵀ (M, N) in x's dtype, W read as its blocks (M padded to a power of two)."""
    rows, n = x.shape[0], w.shape[0]
    padded = triton.next_power_of_2(rows)  # one compilation per 1, 2, 4, 8, 16 rows
    out = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    mins = w.mins if w.mins is not None else w.scales  # an unread placeholder for Q4_0 / Q8_0
    _quant_gemv[(triton.cdiv(n, BN),)](x, w.scales, mins, w.quants, out, rows, n, w.shape[1] // BLOCK, x.stride(0),
                                       out.stride(0), KIND=KINDS[w.qtype], ROWS=padded, BN=BN,
                                       BB=TILE // BLOCK // padded)
    return out
