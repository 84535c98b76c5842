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
# Tiles (judged on the H200 by benchmarks/tools/gemv_sweep.py --tiles; the first shape of the kernel, with its
# sums reduced across threads every step and a loop Triton could not pipeline, read an 8B's Q4_0 projections at
# 12.5% of the copy bandwidth: benchmarks/results/gemv-llama3-8b-q4_0-h200.json)
BN = 8  # output rows per program (fewer where the rows would give fewer programs than PROGRAMS)
PROGRAMS = 264  # two programs per SM of an H100/H200 at least: a smaller weight takes fewer rows a program
VALUES = 8192  # weights × rows multiplied per program and loop step: blocks per step = VALUES / 32 / BN / rows
WARPS = 4
STAGES = 3  # loads in flight per program: the next steps' tiles load while this one's are summed
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


def nibbles(quants: torch.Tensor, n: int) -> torch.Tensor:
    """A Q4 weight's 4-bit values (N, K/32, 32) in order, from its quants (N, K/2): value i of a block is the low
    nibble of its byte i, value i + 16 the high one."""
    q = quants.view(n, -1, BLOCK // 2)
    return torch.cat([q & 0x0F, q >> 4], dim=-1)


def dequantized(w: QuantWeight, dtype: torch.dtype) -> torch.Tensor:
    """The weight's values (N, K) as `dtype` (prompts: dequantize, then a GEMM)."""
    n, k = w.shape
    d = w.scales.float().unsqueeze(-1)  # (N, K/32, 1)
    if w.qtype == "Q8_0":
        return (w.quants.view(n, -1, BLOCK).float() * d).reshape(n, k).to(dtype)
    q = nibbles(w.quants, n).float()  # (N, K/32, 32)
    values = d * q + w.mins.float().unsqueeze(-1) if w.qtype == "Q4_1" else d * (q - 8)
    return values.reshape(n, k).to(dtype)


class Tiles(NamedTuple):
    bn: int = BN
    values: int = VALUES
    warps: int = WARPS
    stages: int = STAGES


TILES = Tiles()  # what quant_gemv launches with (gemv_sweep.py --tiles sets others to time them)


@triton.jit
def q4_products(q, d, m, xl, xh, KIND: tl.constexpr):
    """(…, BN, BB): each block's Σ w·x over a tile of Q4 blocks q (BN, BB, 16 bytes: value j of a block in the low
    nibble of its byte j, value j + 16 in the high one) against x's two halves xl, xh (broadcast to q's last two
    dimensions, with any rows ahead), w = d·(q − 8) (Q4_0, KIND 0) or d·q + m (Q4_1, KIND 1) in float32, as
    `dequantized` computes it (the scales d and mins m: (BN, BB))."""
    low, high = (q & 0x0F).to(tl.float32), (q >> 4).to(tl.float32)
    if KIND == 1:  # d·q + m per value, as the reference dequantizes
        return tl.sum(xl * (d[:, :, None] * low + m[:, :, None]) + xh * (d[:, :, None] * high + m[:, :, None]), -1)
    return tl.sum(xl * (low - 8.0) + xh * (high - 8.0), -1) * d


@triton.jit
def _quant_gemv(x_ptr, scale_ptr, min_ptr, q_ptr, out_ptr, rows, n, sx, so, NBLOCKS: tl.constexpr,
                KIND: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, STAGES: tl.constexpr):
    """BN output rows a program; each step reads BB blocks of each as their bytes, once (a Q4 byte holds a block's
    values j and j + 16, so the low and high nibbles meet their two halves of x). Each block's scaled sum accumulates
    in place and the sums across blocks are taken once, after the loop. One row of x (decode) is multiplied as a
    (BN, BB, WIDTH) tile, the layout its loads have, so a block's sum stays in its thread; more rows broadcast over a
    fourth dimension. K (NBLOCKS) is a constant: one build per projection width, and a loop Triton pipelines over
    STAGES tiles in flight."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)  # output rows of W
    n_ok = cols < n
    r = tl.arange(0, ROWS)
    r_ok = r < rows
    WIDTH: tl.constexpr = 32 if KIND == 2 else 16  # bytes of one block's quants
    j = tl.arange(0, WIDTH)
    if ROWS == 1:
        acc = tl.zeros((BN, BB), tl.float32)
    else:
        acc = tl.zeros((ROWS, BN, BB), tl.float32)
    for b0 in tl.range(0, NBLOCKS, BB, num_stages=STAGES):
        blocks = b0 + tl.arange(0, BB)
        b_ok = blocks < NBLOCKS
        ok = n_ok[:, None] & b_ok[None, :]  # (BN, BB)
        d = tl.load(scale_ptr + cols[:, None] * NBLOCKS + blocks[None, :], mask=ok, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + cols[:, None, None] * (NBLOCKS * WIDTH) + (blocks[:, None] * WIDTH + j[None, :])[None],
                    mask=ok[:, :, None], other=0)  # (BN, BB, WIDTH)
        if ROWS == 1:  # x's values (BB, WIDTH), broadcast over the BN rows
            at = blocks[:, None] * 32 + j[None, :]
            x_ok = b_ok[:, None]
        else:  # (ROWS, 1, BB, WIDTH)
            at = (r[:, None, None] * sx + (blocks[:, None] * 32 + j[None, :])[None])[:, None]
            x_ok = (r_ok[:, None, None] & b_ok[None, :, None])[:, None]
        x = tl.load(x_ptr + at, mask=x_ok, other=0.0).to(tl.float32)
        if KIND == 2:
            acc += tl.sum(x * q.to(tl.float32), axis=-1) * d
        else:
            x_high = tl.load(x_ptr + at + 16, mask=x_ok, other=0.0).to(tl.float32)  # values 16..31 of each block
            m = d
            if KIND == 1:
                m = tl.load(min_ptr + cols[:, None] * NBLOCKS + blocks[None, :], mask=ok, other=0.0).to(tl.float32)
            acc += q4_products(q, d, m, x, x_high, KIND)
    if ROWS == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.sum(acc, axis=2)
    tl.store(out_ptr + r[:, None] * so + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & n_ok[None, :])


def launch(n: int, blocks: int, padded: int, tiles: Tiles, programs: int = PROGRAMS) -> tuple[int, int]:
    """(BN, BB) for a weight of n rows of `blocks` blocks and `padded` rows of x: BN halved (to 1) while the programs
    would number fewer than `programs` (1 off a GPU: Triton's interpreter runs programs one after another, and a
    tiny model's projections at BN = 1 made the CPU suite's three model tests 8× slower), BB from the values a
    step multiplies (a power of two, at least 4: at 16 rows and 2 blocks a step a thread's share of the blocks was
    2 bytes, loaded as such; at 4, 16-byte transfers), and no more than a row's blocks (rounded up to a power of
    two: the default model's 18)."""
    bn = tiles.bn
    while bn > 1 and triton.cdiv(n, bn) < programs:
        bn //= 2
    return bn, min(triton.next_power_of_2(blocks), max(4, tiles.values // BLOCK // bn // padded))


def quant_gemv(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x (M, K), M ≤ GEMV_ROWS → x·Wᵀ (M, N) in x's dtype, W read as its blocks (M padded to a power of two)."""
    rows, n = x.shape[0], w.shape[0]
    padded = triton.next_power_of_2(rows)  # one compilation per 1, 2, 4, 8, 16 rows
    out = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    mins = w.mins if w.mins is not None else w.scales  # an unread placeholder for Q4_0 / Q8_0
    bn, bb = launch(n, w.shape[1] // BLOCK, padded, TILES, PROGRAMS if x.is_cuda else 1)
    _quant_gemv[(triton.cdiv(n, bn),)](x, w.scales, mins, w.quants, out, rows, n, x.stride(0), out.stride(0),
                                       NBLOCKS=w.shape[1] // BLOCK, KIND=KINDS[w.qtype], ROWS=padded, BN=bn, BB=bb,
                                       STAGES=TILES.stages, num_warps=TILES.warps)
    return out
