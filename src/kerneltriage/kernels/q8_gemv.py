"""The decode row's GEMV over Q4_0 / Q4_1 / Q8_0 blocks in integers (the `q8_dot` lever), as llama.cpp's MMVQ does it:
x is quantized to int8 per 32-value block (dx = amax/127, xq = round(x/dx), and Σ xq), each block's dot product
is summed in int32 by `dp4a` (four int8 × int8 products and an add in one instruction), and one float multiply a
block scales it. The float kernel (quant_gemv.py) spends a convert and an FMA a weight; this spends two dp4a and
a few bit operations per 8 Q4 weights, so the weight bytes, not the arithmetic, bound it.

With xq ≈ x/dx per block and a weight value w = d·(q − 8) (Q4_0), d·q + m (Q4_1) or d·q (Q8_0):

    Σ w·x ≈ d·dx·(Σ q·xq − 8·Σ xq)      Q4_0
    Σ w·x ≈ d·dx·Σ q·xq + m·dx·Σ xq     Q4_1
    Σ w·x ≈ d·dx·Σ q·xq                 Q8_0 (q signed)

The approximation is x's rounding alone (|x − dx·xq| ≤ dx/2 a value): a Q4_0 block's sum is off by at most
d·dx/2·Σ|q − 8|. The integer sums are exact (a block's |Σ q·xq| ≤ 32·127·127 fits an int32).

The Q4 quants (N, K/2) uint8 are read as int32 words (N, K/8), four a block: byte b of word w holds value 4w + b in
its low nibble and 16 + 4w + b in its high one, so `word & 0x0F0F0F0F` meets x's word w (its values 4w..4w+3 as
int8) and `(word >> 4) & 0x0F0F0F0F` x's word w + 4. Q8_0's quants (N, K) int8 are read as (N, K/4) words, each
meeting x's word of the same place. x is quantized first, once, by its own kernel (`_quantize_x`), as llama.cpp's
quantize_q8_1: a launch a projection. Quantizing inside the GEMV instead (each program its own K tile, every step)
measured slower than the float GEMV on the H200 (an 8B's gate/up 65.6 against 45.0 µs: 17 barriers, 10 shared-memory
loads and 6 shuffles a step in its PTX, moving x's words into the weights' layout).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kerneltriage.kernels.quant_gemv import BLOCK, KINDS, PROGRAMS, QuantWeight, Tiles, launch

# what q8_gemv launches with (gemv_sweep.py --tiles sets others to time them): 2 rows, 4,096 values a step, 4 warps,
# no pipelining — the fastest over a layer's GEMVs of the five best of 21 tiles in a probe, timed again by the tool
# on an 8B's Q4_0 shapes: packed q/k/v 7.9 µs, o 6.0, packed gate/up 20.6 (76.6% of copy), down 14.5 — 49.0 µs a
# layer against the float GEMV's 90.3 (12.6, 9.5, 44.7, 23.5) (H200;
# benchmarks/results/gemv-llama3-8b-q4_0-h200-q8-tiles.json, benchmarks/results/gemv-llama3-8b-q4_0-h200-float.json)
TILES = Tiles(bn=2, values=4096, warps=4, stages=1)


@triton.jit
def dp4a(a, b, c, ASM: tl.constexpr):
    """c + Σ over the four bytes i of a_i·b_i, each byte a signed int8, in int32 (broadcast). ASM: the `dp4a` PTX
    instruction; otherwise the same sum in arithmetic (Triton's interpreter runs no inline assembly): byte i
    sign-extended by shifting it to the top and back."""
    if ASM:
        return tl.inline_asm_elementwise(asm="dp4a.s32.s32 $0, $1, $2, $3;", constraints="=r,r,r,r", args=[a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        for i in tl.static_range(4):
            c += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
        return c


@triton.jit
def int8_words(x, scale):
    """x (BB, W, 4) float32 times its block's scale (BB,), rounded half away from zero (as llama.cpp's roundf), as
    (BB, W) int32 words of four int8 (byte i: x[..., i]) and the int8 values' sum over each word (BB, W)."""
    v = x * scale[:, None, None]
    xq = (v + tl.where(v >= 0, 0.5, -0.5)).to(tl.int32)  # the conversion truncates: |v| ≤ 127 → [-127, 127]
    shifts = tl.arange(0, 4) * 8
    words = tl.sum((xq & 0xFF) << shifts[None, None, :], axis=2)  # disjoint bits: the sum is an OR
    return words, tl.sum(xq, axis=2)


@triton.jit
def _quantize_x(x_ptr, words_ptr, dx_ptr, sums_ptr, NBLOCKS: tl.constexpr, BB: tl.constexpr):
    """x's 32-value blocks, BB a program, as int8 words (8 a block: byte i of word w is value 4w + i), each block's
    scale dx = amax/127 (float32) and Σ xq (int32)."""
    blocks = tl.program_id(0) * BB + tl.arange(0, BB)
    b_ok = blocks < NBLOCKS
    at = blocks[:, None, None] * 32 + tl.arange(0, 8)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
    x = tl.load(x_ptr + at, mask=b_ok[:, None, None], other=0.0).to(tl.float32)  # (BB, 8, 4)
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)  # (BB,)
    # an all-zero block: any finite scale gives xq = 0; rounded division (`/` is approximate on the GPU), so that
    # the GPU and the interpreter round x alike
    scale = tl.div_rn(tl.full((BB,), 127.0, tl.float32), tl.maximum(amax, 1e-30))
    words, sums = int8_words(x, scale)  # (BB, 8) each
    tl.store(words_ptr + blocks[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=b_ok[:, None])
    tl.store(dx_ptr + blocks, amax / 127.0, mask=b_ok)
    tl.store(sums_ptr + blocks, tl.sum(sums, axis=1), mask=b_ok)


@triton.jit
def _q8_gemv(xw_ptr, dx_ptr, xs_ptr, scale_ptr, min_ptr, q_ptr, out_ptr, n, NBLOCKS: tl.constexpr,
             KIND: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr):
    """BN output rows a program, one row of x already in int8 words (`_quantize_x`); each step reads BB blocks of
    each row as int32 words (BN, BB, WORDS) and x's words in the same shape, every thread loading the words it
    multiplies (the same addresses for every row: L1 serves the repeats, no exchange between threads). Each block's
    scaled sum accumulates in place (BN, BB), summed across blocks once after the loop, as _quant_gemv does.
    Unpipelined (TILES.stages 1): pipelined, the loads go through shared memory by cp.async.cg, which bypasses L1,
    and every row's copy of x's words went to L2: 4,096 rows took 80 µs against the float GEMV's 9 (H200)."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)  # output rows of W
    n_ok = cols < n
    WORDS: tl.constexpr = 8 if KIND == 2 else 4  # int32 words of one block's quants
    w = tl.arange(0, WORDS)
    row0 = cols[:, None] * 0  # (BN, 1) zeros: x's addresses broadcast over the rows in the weights' own shape
    acc = tl.zeros((BN, BB), tl.float32)
    for b0 in tl.range(0, NBLOCKS, BB, num_stages=STAGES):
        blocks = b0 + tl.arange(0, BB)
        b_ok = blocks < NBLOCKS
        ok = n_ok[:, None] & b_ok[None, :]  # (BN, BB)
        d = tl.load(scale_ptr + cols[:, None] * NBLOCKS + blocks[None, :], mask=ok, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + cols[:, None, None] * (NBLOCKS * WORDS) + (blocks[:, None] * WORDS + w[None, :])[None],
                    mask=ok[:, :, None], other=0)  # (BN, BB, WORDS)
        at = row0[:, :, None] + (blocks[:, None] * 8 + w[None, :])[None]  # (BN, BB, WORDS): x's word w of each block
        dx = tl.load(dx_ptr + row0 + blocks[None, :], mask=ok, other=0.0)  # (BN, BB)
        low = tl.load(xw_ptr + at, mask=ok[:, :, None], other=0)
        if KIND != 2:
            high = tl.load(xw_ptr + at + 4, mask=ok[:, :, None], other=0)
            sums = tl.load(xs_ptr + row0 + blocks[None, :], mask=ok, other=0)
        if KIND == 2:
            dot = tl.sum(dp4a(q, low, tl.zeros_like(q), ASM), axis=2)  # (BN, BB) Σ q·xq
            acc += d * dx * dot.to(tl.float32)
        else:  # values 16 + 4w.. of x (its word w + 4) meet the high nibbles
            dot = dp4a(q & 0x0F0F0F0F, low, tl.zeros_like(q), ASM)
            dot = tl.sum(dp4a((q >> 4) & 0x0F0F0F0F, high, dot, ASM), axis=2)  # (BN, BB) Σ q·xq
            if KIND == 1:
                m = tl.load(min_ptr + cols[:, None] * NBLOCKS + blocks[None, :], mask=ok, other=0.0).to(tl.float32)
                acc += (d * dot.to(tl.float32) + m * sums.to(tl.float32)) * dx
            else:
                acc += d * dx * (dot - 8 * sums).to(tl.float32)
    tl.store(out_ptr + cols, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=n_ok)


ASM = not isinstance(_q8_gemv, InterpretedFunction)  # decorated under TRITON_INTERPRET=1: arithmetic, not PTX


QUANTIZE_BLOCKS = 32  # x's blocks a `_quantize_x` program takes (1,024 values: 4 programs for K = 4,096)


def q8_gemv(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """x (1, K) → x·Wᵀ (1, N) in x's dtype, x rounded to int8 per block (one launch) and the blocks' sums taken in
    int32 (a second)."""
    assert x.shape[0] == 1 and x.stride(-1) == 1, x.shape  # decode's one row (QuantLinear's reshape keeps it dense)
    n, k = w.shape
    blocks = k // BLOCK
    words = torch.empty(k // 4, device=x.device, dtype=torch.int32)
    dx = torch.empty(blocks, device=x.device, dtype=torch.float32)
    sums = torch.empty(blocks, device=x.device, dtype=torch.int32)
    bq = min(QUANTIZE_BLOCKS, triton.next_power_of_2(blocks))
    _quantize_x[(triton.cdiv(blocks, bq),)](x, words, dx, sums, NBLOCKS=blocks, BB=bq)
    out = torch.empty(1, n, device=x.device, dtype=x.dtype)
    mins = w.mins if w.mins is not None else w.scales  # an unread placeholder for Q4_0 / Q8_0
    bn, bb = launch(n, blocks, 1, TILES, PROGRAMS if x.is_cuda else 1)
    _q8_gemv[(triton.cdiv(n, bn),)](words, dx, sums, w.scales, mins, w.quants.view(torch.int32), out, n,
                                    NBLOCKS=blocks, KIND=KINDS[w.qtype], BN=bn, BB=bb, STAGES=TILES.stages, ASM=ASM,
                                    num_warps=TILES.warps)
    return out
