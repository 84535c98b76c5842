"""A Llama-family decoder layer's decode and verify rows (T ≤ 32) as six Triton kernels instead of ~16 stock ones.

Why: under the best lever set the default model's graphed decode step runs ~474 kernels per token at ~3.65 µs each
(triage, H200); its weights are 270 MB, 56 µs of bandwidth. The step is a chain of small kernels, so the lever is
their count, and attention that reads only the filled cache, split across the SMs. Per layer:

1. `_qkv_rope_cache`: RMSNorm in the prologue → packed q/k/v GEMV (+ bias: qwen2) → per-head q/k RMSNorm (qwen3:
   one whole head per program) → RoPE → q to a buffer, k and v into the cache at each row's position (read from
   the device: graph replays need no host value);
2. `_attend`: split-KV attention (flash-decoding): one program per KV head and chunk of keys, all G query heads ×
   T rows of that KV head in one block, reading only keys ≤ the row's position; partial (m, l, acc) per chunk;
3. `_combine`: the chunks combined per query head and row (fused into o_proj's prologue, where every program
   redid it for every head, it cost 12.7 µs against 3.6 for the two kernels: H200,
   fused-layer-probe-h200-before-combine.json and fused-layer-probe-h200.json);
4. `_gemv_residual`: o_proj GEMV → + residual;
5. `_gate_up`: RMSNorm in the prologue → gate and up GEMVs → SiLU(gate) · up;
6. `_gemv_residual`: down GEMV → + residual.

Beside `quantized` a decode row reads the layer's Q4 blocks in place; with `q8_dot` too, each GEMV's x is first
rounded to int8 per 32-value block by a small kernel (`_quantize_row`, the norm in it; four a layer) and the
products are integer dot products (`_gemv2_q8`, as llama.cpp's MMVQ): an approximation of x, judged by its declared
quality.

Arithmetic follows the stock ops' roundings (the activation dtype after each op the stock model rounds at), with
float32 accumulation; a decode row's GEMVs are broadcast products summed in float32, a verify's (16+ rows) go
through tl.dot in IEEE float32 (never TF32), so float32 runs compute what stock computes, reordered.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kerneltriage.kernels import q8_gemv
from kerneltriage.kernels.q8_gemv import dp4a, int8_words
from kerneltriage.kernels.quant_gemv import KINDS, QuantWeight, q4_products

MAX_ROWS = 32  # decode (1) and speculative verify (k + 1 ≤ 32 for suffix:31) rows; prompts take the stock layer
BN = 4  # output columns (q/k/v: rotation pairs) per GEMV program
DOT_ROWS, DOT_BN, DOT_BK = 16, 16, 64  # from 16 padded rows the GEMVs use tl.dot (`_gemv2`), in these tiles,
DOT_STAGES = 8  # with this many rounds of K in flight (Triton's software pipelining; `_tiles` has the numbers)
DOT_WARPS = 4  # warps per tl.dot program: 1 / 2 / 8 made a 16-row verify 4–32% slower (H200,
# verify-kernels-smollm2-preset-h200-round1.json)
SPLIT_PROGRAMS = 64  # a tl.dot GEMV's K split over programs until there are this many (0: never; `_k_splits`)
HEAD_ROUNDS = 1  # rounds of K per program of a decode's q/k/v GEMV tiled by whole heads (per-head norms), K split
# over programs for the rest: one head per program alone leaves qwen3-0.6b's decode 32 programs on 132 SMs, each
# reading K in 8 rounds one after another (1: 256 programs, one round each, as the llama tiles read K at once; a
# choice by analogy, to be measured: `_head_tiles`)
STAGE_BYTES = 96 * 1024  # shared memory a head tile's pipelined rounds may take (float32 weights; H200: 227 KB)
MAX_BLOCKS = 4096  # column blocks of one split-K GEMV at most (the semaphores: `_semaphores`)
DECODE_BK, DECODE_STAGES = 512, 3  # a decode row's rounds where K takes more than one TILE (`_tiles`): a choice by
# analogy with the Q4 GEMV's third shape, to be measured on the 8B
QUANT_BK = 1024  # values of K per round for a decode row reading Q4 blocks (`_gemv2`'s QK: 64 blocks, 4 KB of a
# 4-column tile): the fastest of 256–2,048 in `device_run.sh fused-tiles` on the Q4_0 8B (H200, ninth session; that
# run's file was lost with its session: docs/journal.md, 2026-12-03 tenth session)
Q8_ROWS, Q8_BK = 2, 2048  # with q8_dot: weight rows a program and values of K a step of a decode row reading x as
# int8 words (`_gemv2_q8`), unpipelined — q8_gemv's tile (2 rows, 4,096 values a step), the fastest of 21 there
Q8_BLOCKS = 32  # x's blocks a `_quantize_row` program writes
_ASM = tl.constexpr(q8_gemv.ASM)  # dp4a as the PTX instruction (compiled) or as arithmetic (the interpreter)
QK_KINDS = {name: KINDS[name] + 1 for name in ("Q4_0", "Q4_1")}  # the block types a decode row reads in place
# (`_gemv2_q4`'s QK: quant_gemv's kind + 1; 0 is a matrix of values)
TILE = 8192  # elements of a GEMV program's (rows, columns, K) tile per weight: registers, not shared memory
WIDE = 8192  # weight elements a program holds at once above which it runs 8 warps instead of 4
BLOCK_S = 64  # keys per attention tile
MAX_SPLITS = 32  # chunks of keys per KV head, combined by `_combine` (16 gave 1,396 tok/s at depth 2048, 32: 1,500)
ROWS_MIN = 16  # tl.dot wants at least 16 rows


@triton.jit
def _rnd(v, dt: tl.constexpr):
    """v rounded to the activation dtype (what a stock op's output holds), back in float32."""
    return v.to(dt).to(tl.float32)


@triton.jit
def _inv_rms(x_ptr, sx, r, r_ok, k, eps, ROWS: tl.constexpr, BK: tl.constexpr, ROUNDS: tl.constexpr,
             STAGES: tl.constexpr):
    """1 / rms of each row of x (ROWS, k), in float32: squares summed in place, across K once after the loop."""
    sq = tl.zeros((ROWS, BK), tl.float32)
    for i in tl.range(0, ROUNDS, num_stages=STAGES):
        kk = i * BK + tl.arange(0, BK)
        x = tl.load(x_ptr + r[:, None] * sx + kk[None, :], mask=r_ok[:, None] & (kk < k)[None, :], other=0.0)
        x = x.to(tl.float32)
        sq += x * x
    return tl.rsqrt(tl.sum(sq, 1) / k + eps)


@triton.jit
def _gemv2_q4(x_ptr, wa_ptr, wb_ptr, sa_ptr, sb_ptr, ma_ptr, mb_ptr, sw, cols_a, cols_b, n_ok, k, eps, nw_ptr,
              dt: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              ROUNDS: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr, QK: tl.constexpr):
    """`_gemv2` for one decode row whose weights are Q4 blocks (quants (N, K/2) bytes a row `sw` apart, scales and
    Q4_1's mins (N, K/32) float16): each round BK values of K as BK/32 blocks of each of the BN columns, read once,
    x's two halves of each block against their low and high nibbles; each block's product summed in place, across
    blocks once after the loop."""
    NB: tl.constexpr = BK // 32
    j = tl.arange(0, 16)
    wide_a = tl.zeros((BN, NB), tl.float32)
    wide_b = tl.zeros((BN, NB), tl.float32)
    ss = k // 32  # scales (and mins) a row
    if PDL:
        tl.extra.cuda.gdc_wait()  # the rounds are pipelined: the wait goes first
    if NORM and ROUNDS > 1:
        inv = tl.sum(_inv_rms(x_ptr, 0, tl.arange(0, 1), tl.full((1,), True, tl.int1), k, eps, 1, BK, ROUNDS,
                              STAGES), 0)
    for i in tl.range(0, ROUNDS, num_stages=STAGES):
        b = i * NB + tl.arange(0, NB)  # blocks of K
        b_ok = b < ss
        ok = n_ok[:, None] & b_ok[None, :]
        qa = tl.load(wa_ptr + cols_a[:, None, None] * sw + (b[:, None] * 16 + j[None, :])[None], mask=ok[:, :, None],
                     other=0)
        da = tl.load(sa_ptr + cols_a[:, None] * ss + b[None, :], mask=ok, other=0.0).to(tl.float32)
        mina = da
        if QK == 2:
            mina = tl.load(ma_ptr + cols_a[:, None] * ss + b[None, :], mask=ok, other=0.0).to(tl.float32)
        if TWO:
            qb = tl.load(wb_ptr + cols_b[:, None, None] * sw + (b[:, None] * 16 + j[None, :])[None],
                         mask=ok[:, :, None], other=0)
            db = tl.load(sb_ptr + cols_b[:, None] * ss + b[None, :], mask=ok, other=0.0).to(tl.float32)
            minb = db
            if QK == 2:
                minb = tl.load(mb_ptr + cols_b[:, None] * ss + b[None, :], mask=ok, other=0.0).to(tl.float32)
        at = b[:, None] * 32 + j[None, :]  # (NB, 16): x's values meeting the low nibbles; + 16 the high ones
        xl = tl.load(x_ptr + at, mask=b_ok[:, None], other=0.0).to(tl.float32)
        xh = tl.load(x_ptr + at + 16, mask=b_ok[:, None], other=0.0).to(tl.float32)
        if NORM:
            if ROUNDS == 1:
                inv = tl.rsqrt((tl.sum(tl.sum(xl * xl, 1), 0) + tl.sum(tl.sum(xh * xh, 1), 0)) / k + eps)
            nwl = tl.load(nw_ptr + at, mask=b_ok[:, None], other=0.0).to(tl.float32)
            nwh = tl.load(nw_ptr + at + 16, mask=b_ok[:, None], other=0.0).to(tl.float32)
            xl = _rnd(_rnd(xl * inv, dt) * nwl, dt)
            xh = _rnd(_rnd(xh * inv, dt) * nwh, dt)
        wide_a += q4_products(qa, da, mina, xl[None], xh[None], QK - 1)
        if TWO:
            wide_b += q4_products(qb, db, minb, xl[None], xh[None], QK - 1)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    return tl.reshape(tl.sum(wide_a, 1), (1, BN)), tl.reshape(tl.sum(wide_b, 1), (1, BN))


@triton.jit
def _quantize_row(x_ptr, nw_ptr, words_ptr, dx_ptr, sums_ptr, k, eps, NORM: tl.constexpr, BB: tl.constexpr,
                  ROUNDS: tl.constexpr, PDL: tl.constexpr):
    """One row of x (k values) as int8 words per 32-value block, BB blocks a program, in q8_gemv's layout (words,
    dx = amax/127, Σ xq: `q8_gemv._quantize_x`); with NORM first RMS-normalised and weighted as the stock RMSNorm
    rounds it (each program sums the whole row's squares, in ROUNDS rounds of BB·32: x is a few KB, from L2)."""
    dt: tl.constexpr = x_ptr.dtype.element_ty
    if PDL:
        tl.extra.cuda.gdc_wait()  # x is the previous kernel's output
    blocks = tl.program_id(0) * BB + tl.arange(0, BB)
    b_ok = blocks < k // 32
    at = blocks[:, None, None] * 32 + tl.arange(0, 8)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
    x = tl.load(x_ptr + at, mask=b_ok[:, None, None], other=0.0).to(tl.float32)  # (BB, 8, 4)
    if NORM:
        inv = tl.sum(_inv_rms(x_ptr, 0, tl.arange(0, 1), tl.full((1,), True, tl.int1), k, eps, 1, BB * 32, ROUNDS,
                              1), 0)
        nw = tl.load(nw_ptr + at, mask=b_ok[:, None, None], other=0.0).to(tl.float32)
        x = _rnd(_rnd(x * inv, dt) * nw, dt)
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)  # (BB,)
    scale = tl.div_rn(tl.full((BB,), 127.0, tl.float32), tl.maximum(amax, 1e-30))  # as _quantize_x
    words, sums = int8_words(x, scale)  # (BB, 8) each
    tl.store(words_ptr + blocks[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=b_ok[:, None])
    tl.store(dx_ptr + blocks, amax / 127.0, mask=b_ok)
    tl.store(sums_ptr + blocks, tl.sum(sums, axis=1), mask=b_ok)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _q4_dot(w_ptr, s_ptr, m_ptr, cols, b, ok, sw, ss, low, high, dx, sums, QK: tl.constexpr):
    """(BN, NB) each block's Σ w·x of Q4 rows `cols` (quants as int32 words, `sw` words a row) over blocks b against
    x's int8 words low (values 4w..) and high (16 + 4w..), (BN, NB, 4) each, as q8_gemv's `_q8_gemv` sums them."""
    w = tl.arange(0, 4)
    q = tl.load(w_ptr + cols[:, None, None] * sw + (b[:, None] * 4 + w[None, :])[None], mask=ok[:, :, None], other=0)
    d = tl.load(s_ptr + cols[:, None] * ss + b[None, :], mask=ok, other=0.0).to(tl.float32)
    dot = dp4a(q & 0x0F0F0F0F, low, tl.zeros_like(q), _ASM)
    dot = tl.sum(dp4a((q >> 4) & 0x0F0F0F0F, high, dot, _ASM), axis=2)  # (BN, NB) Σ q·xq
    if QK == 2:  # Q4_1: d·q + m
        m = tl.load(m_ptr + cols[:, None] * ss + b[None, :], mask=ok, other=0.0).to(tl.float32)
        return (d * dot.to(tl.float32) + m * sums.to(tl.float32)) * dx
    return d * dx * (dot - 8 * sums).to(tl.float32)


@triton.jit
def _gemv2_q8(xw_ptr, dx_ptr, xs_ptr, wa_ptr, wb_ptr, sa_ptr, sb_ptr, ma_ptr, mb_ptr, sw, cols_a, cols_b, n_ok, k,
              TWO: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ROUNDS: tl.constexpr, PDL: tl.constexpr,
              QK: tl.constexpr):
    """`_gemv2_q4` with x already int8 words (`_quantize_row`; its norm there): each round BK values of K as BK/32
    blocks of each of the BN columns, their products summed by dp4a; x's words loaded by every column's threads in
    the weights' shape, through L1 (unpipelined: cp.async bypasses L1 — q8_gemv.py)."""
    NB: tl.constexpr = BK // 32
    zero = cols_a[:, None] * 0  # (BN, 1): x's addresses broadcast over the columns
    wide_a = tl.zeros((BN, NB), tl.float32)
    wide_b = tl.zeros((BN, NB), tl.float32)
    ss = k // 32
    if PDL:
        tl.extra.cuda.gdc_wait()
    for i in tl.range(0, ROUNDS, num_stages=1):
        b = i * NB + tl.arange(0, NB)
        ok = n_ok[:, None] & (b < ss)[None, :]
        at = zero[:, :, None] + (b[:, None] * 8 + tl.arange(0, 4)[None, :])[None]  # (BN, NB, 4)
        low = tl.load(xw_ptr + at, mask=ok[:, :, None], other=0)
        high = tl.load(xw_ptr + at + 4, mask=ok[:, :, None], other=0)
        dx = tl.load(dx_ptr + zero + b[None, :], mask=ok, other=0.0)
        sums = tl.load(xs_ptr + zero + b[None, :], mask=ok, other=0)
        wide_a += _q4_dot(wa_ptr, sa_ptr, ma_ptr, cols_a, b, ok, sw, ss, low, high, dx, sums, QK)
        if TWO:
            wide_b += _q4_dot(wb_ptr, sb_ptr, mb_ptr, cols_b, b, ok, sw, ss, low, high, dx, sums, QK)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    return tl.reshape(tl.sum(wide_a, 1), (1, BN)), tl.reshape(tl.sum(wide_b, 1), (1, BN))


@triton.jit
def _gemv2(x_ptr, sx, wa_ptr, wb_ptr, sw, cols_a, cols_b, n_ok, r, r_ok, k, eps, nw_ptr, dt: tl.constexpr,
           NORM: tl.constexpr, TWO: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           ROUNDS: tl.constexpr, STAGES: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """(ROWS, BN) float32 twice: x (ROWS, k) · Wa[cols_a]ᵀ and (when TWO) x · Wb[cols_b]ᵀ, both weights' tiles
    loaded in the same round, K in ROUNDS rounds of BK (STAGES of them in flight at once) — this program's share
    of K, the program_id(1)-th of SPLITS (`_split_sum` adds the shares up). With NORM, x is first
    RMS-normalised and weighted as the stock RMSNorm rounds it (normed → dtype, × weight → dtype); in one round,
    its RMS comes from the same load. From 16 rows and 16 columns (a k ≥ 8 verify) the products go through tl.dot
    (tensor cores; IEEE float32 for float32 weights); fewer are summed on the CUDA cores.
    PDL: in one round the weights (which no kernel writes) are requested before waiting for the previous kernel,
    x after; where x is read before the weights (its RMS over several rounds) or the rounds are pipelined (the
    pipeliner hoists the first rounds' loads of x), the wait comes first."""
    DOT: tl.constexpr = ROWS >= 16 and BN >= 16  # tl.dot's smallest tile
    WHOLE: tl.constexpr = ROUNDS * SPLITS  # rounds over the whole of K
    EARLY: tl.constexpr = PDL and (DOT or STAGES > 1 or (NORM and WHOLE > 1))
    # a decode row over several rounds: products summed in place, across K once after the loop (a sum across the
    # threads every round kept one round in flight: `_tiles`)
    DEFER: tl.constexpr = not DOT and ROWS == 1 and ROUNDS > 1
    acc_a = tl.zeros((ROWS, BN), tl.float32)
    acc_b = tl.zeros((ROWS, BN), tl.float32)
    wide_a = tl.zeros((BN, BK) if DEFER else (1, 1), tl.float32)
    wide_b = tl.zeros((BN, BK) if DEFER else (1, 1), tl.float32)
    inv = tl.full((ROWS,), 1.0, tl.float32)
    if EARLY:
        tl.extra.cuda.gdc_wait()
    if NORM and WHOLE > 1:
        inv = _inv_rms(x_ptr, sx, r, r_ok, k, eps, ROWS, BK, WHOLE, STAGES)
    first = tl.program_id(1) * ROUNDS
    for i in tl.range(0, ROUNDS, num_stages=STAGES):
        kk = (first + i) * BK + tl.arange(0, BK)
        k_ok = kk < k
        w_ok = n_ok[:, None] & k_ok[None, :]
        wa = tl.load(wa_ptr + cols_a[:, None] * sw + kk[None, :], mask=w_ok, other=0.0)
        if TWO:
            wb = tl.load(wb_ptr + cols_b[:, None] * sw + kk[None, :], mask=w_ok, other=0.0)
        if PDL and not EARLY:
            tl.extra.cuda.gdc_wait()  # x is the previous kernel's output
        x = tl.load(x_ptr + r[:, None] * sx + kk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        x = x.to(tl.float32)
        if NORM:
            if WHOLE == 1:
                inv = tl.rsqrt(tl.sum(x * x, 1) / k + eps)
            nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
            x = _rnd(_rnd(x * inv[:, None], dt) * nw[None, :], dt)
        if DOT:  # tensor cores (x is exact in the weights' dtype)
            acc_a += tl.dot(x.to(wa.dtype), tl.trans(wa), input_precision="ieee")
            if TWO:
                acc_b += tl.dot(x.to(wb.dtype), tl.trans(wb), input_precision="ieee")
        elif DEFER:
            wide_a += tl.reshape(x, (1, BK)) * wa.to(tl.float32)
            if TWO:
                wide_b += tl.reshape(x, (1, BK)) * wb.to(tl.float32)
        else:
            acc_a += tl.sum(x[:, None, :] * wa.to(tl.float32)[None, :, :], 2)
            if TWO:
                acc_b += tl.sum(x[:, None, :] * wb.to(tl.float32)[None, :, :], 2)
    if DEFER:
        acc_a = tl.reshape(tl.sum(wide_a, 1), (1, BN))
        if TWO:
            acc_b = tl.reshape(tl.sum(wide_b, 1), (1, BN))
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start requesting its weights
    return acc_a, acc_b


@triton.jit
def _split_sum(acc_a, acc_b, ws_ptr, sem_ptr, TWO: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr,
               SPLITS: tl.constexpr):
    """(a, b, last): with K split over SPLITS programs per column block, each stores its share in the workspace
    and counts itself in the block's semaphore; the last to arrive sums the shares in split order (the same sum
    whichever arrives last) and zeroes the semaphore for the next launch. `last` masks the caller's stores: only
    that program holds the sums. One split: the shares are the sums."""
    last = tl.program_id(1) == SPLITS - 1
    if SPLITS > 1:
        block, split = tl.program_id(0), tl.program_id(1)
        at = tl.arange(0, ROWS)[:, None] * BN + tl.arange(0, BN)[None, :]
        share: tl.constexpr = ROWS * BN * (2 if TWO else 1)
        base = ws_ptr + block * SPLITS * share
        tl.store(base + split * share + at, acc_a)
        if TWO:
            tl.store(base + split * share + ROWS * BN + at, acc_b)
        tl.debug_barrier()  # every thread's share stored before the count (the atomic's release covers them)
        last = tl.atomic_add(sem_ptr + block, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
        acc_a = tl.zeros((ROWS, BN), tl.float32)
        acc_b = tl.zeros((ROWS, BN), tl.float32)
        for j in tl.static_range(SPLITS):  # from L2 (.cg): other SMs wrote them
            acc_a += tl.load(base + j * share + at, mask=last, other=0.0, cache_modifier=".cg")
            if TWO:
                acc_b += tl.load(base + j * share + ROWS * BN + at, mask=last, other=0.0, cache_modifier=".cg")
        tl.store(sem_ptr + block, 0, mask=last)
    return acc_a, acc_b, last


@triton.jit
def _head_norm(lo, hi, head, j, p_ok, qn_ptr, kn_ptr, eps, HQ: tl.constexpr, HKV: tl.constexpr, DIM: tl.constexpr,
               dt: tl.constexpr):
    """(lo, hi) with q and k heads RMS-normalised over the head and weighted by q_norm / k_norm, rounded as the stock
    RMSNorm rounds (normed → dtype, × weight → dtype); v heads as they were. The program's columns are one whole
    head (pairs j and j + HALF), so its sum of squares is one sum over them; masked columns hold 0."""
    HALF: tl.constexpr = DIM // 2
    inv = tl.rsqrt(tl.sum(lo * lo + hi * hi, 1) / DIM + eps)  # (ROWS,)
    is_q = p_ok & (head < HQ)
    is_k = p_ok & (head >= HQ) & (head < HQ + HKV)
    w_lo = tl.load(qn_ptr + j, mask=is_q, other=0.0).to(tl.float32) + tl.load(kn_ptr + j, mask=is_k,
                                                                             other=0.0).to(tl.float32)
    w_hi = tl.load(qn_ptr + j + HALF, mask=is_q, other=0.0).to(tl.float32) + tl.load(kn_ptr + j + HALF, mask=is_k,
                                                                                    other=0.0).to(tl.float32)
    normed = (is_q | is_k)[None, :]
    lo = tl.where(normed, _rnd(_rnd(lo * inv[:, None], dt) * w_lo[None, :], dt), lo)
    hi = tl.where(normed, _rnd(_rnd(hi * inv[:, None], dt) * w_hi[None, :], dt), hi)
    return lo, hi


@triton.jit
def _qkv_rope_cache(x_ptr, xw_ptr, dx_ptr, xs_ptr, nw_ptr, w_ptr, s_ptr, m_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr,
                    sin_ptr, ids_ptr, q_ptr, k_ptr, v_ptr, ws_ptr, sem_ptr, eps, hidden, sx, sw, sc, sq_t, sq_h, sk_h,
                    sk_s, sv_h, sv_s, T: tl.constexpr, ROWS: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                    DIM: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr, ROUNDS: tl.constexpr,
                    STAGES: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr,
                    PDL: tl.constexpr, QK: tl.constexpr, Q8: tl.constexpr):
    HALF: tl.constexpr = DIM // 2
    dt: tl.constexpr = q_ptr.dtype.element_ty
    # rotation pairs (j, j + HALF) of every head, q then k then v; QK_NORM: BP = HALF, one whole head per program
    p = tl.program_id(0) * BP + tl.arange(0, BP)
    head, j = p // HALF, p % HALF
    p_ok = head < HQ + 2 * HKV
    lo_col = head * DIM + j
    r = tl.arange(0, ROWS)
    r_ok = r < T
    if Q8:  # one decode row over Q4 blocks, x as int8 words (normed by `_quantize_row`)
        lo, hi = _gemv2_q8(xw_ptr, dx_ptr, xs_ptr, w_ptr, w_ptr, s_ptr, s_ptr, m_ptr, m_ptr, sw, lo_col,
                           lo_col + HALF, p_ok, hidden, True, BP, BK, ROUNDS, PDL, QK)
    elif QK:  # one decode row over Q4 blocks
        lo, hi = _gemv2_q4(x_ptr, w_ptr, w_ptr, s_ptr, s_ptr, m_ptr, m_ptr, sw, lo_col, lo_col + HALF, p_ok, hidden,
                           eps, nw_ptr, dt, True, True, BP, BK, ROUNDS, STAGES, PDL, QK)
    else:
        lo, hi = _gemv2(x_ptr, sx, w_ptr, w_ptr, sw, lo_col, lo_col + HALF, p_ok, r, r_ok, hidden, eps, nw_ptr, dt,
                        True, True, ROWS, BP, BK, ROUNDS, STAGES, SPLITS, PDL)
    lo, hi, last = _split_sum(lo, hi, ws_ptr, sem_ptr, True, ROWS, BP, SPLITS)
    if HAS_BIAS:
        lo += tl.load(b_ptr + lo_col, mask=p_ok, other=0.0).to(tl.float32)[None, :]
        hi += tl.load(b_ptr + lo_col + HALF, mask=p_ok, other=0.0).to(tl.float32)[None, :]
    lo, hi = _rnd(lo, dt), _rnd(hi, dt)
    if QK_NORM:  # qwen3: each q and k head RMS-normalised before RoPE
        lo, hi = _head_norm(lo, hi, head, j, p_ok, qn_ptr, kn_ptr, eps, HQ, HKV, DIM, dt)
    # RoPE on q and k (HF layout: x·cos + rotate_half(x)·sin, each product and the sum rounded as stock rounds)
    both = r_ok[:, None] & p_ok[None, :] & last
    cs = r[:, None] * sc + j[None, :]
    c_lo = tl.load(cos_ptr + cs, mask=both, other=0.0).to(tl.float32)
    c_hi = tl.load(cos_ptr + cs + HALF, mask=both, other=0.0).to(tl.float32)
    s_lo = tl.load(sin_ptr + cs, mask=both, other=0.0).to(tl.float32)
    s_hi = tl.load(sin_ptr + cs + HALF, mask=both, other=0.0).to(tl.float32)
    rotates = (head < HQ + HKV)[None, :]
    out_lo = tl.where(rotates, _rnd(_rnd(lo * c_lo, dt) + _rnd(-hi * s_lo, dt), dt), lo)
    out_hi = tl.where(rotates, _rnd(_rnd(hi * c_hi, dt) + _rnd(lo * s_hi, dt), dt), hi)
    pos = tl.load(ids_ptr + r, mask=r_ok, other=0)
    q_at = q_ptr + r[:, None] * sq_t + head[None, :] * sq_h + j[None, :]
    is_q = both & (head < HQ)[None, :]
    tl.store(q_at, out_lo.to(dt), mask=is_q)
    tl.store(q_at + HALF, out_hi.to(dt), mask=is_q)
    k_at = k_ptr + (head - HQ)[None, :] * sk_h + pos[:, None] * sk_s + j[None, :]
    is_k = both & ((head >= HQ) & (head < HQ + HKV))[None, :]
    tl.store(k_at, out_lo.to(dt), mask=is_k)
    tl.store(k_at + HALF, out_hi.to(dt), mask=is_k)
    v_at = v_ptr + (head - HQ - HKV)[None, :] * sv_h + pos[:, None] * sv_s + j[None, :]
    is_v = both & (head >= HQ + HKV)[None, :]
    tl.store(v_at, out_lo.to(dt), mask=is_v)
    tl.store(v_at + HALF, out_hi.to(dt), mask=is_v)


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, ids_ptr, m_ptr, l_ptr, acc_ptr, sq_t, sq_h, sk_h, sk_s, sv_h, sv_s,
            chunk, scale, splits, dim,
            T: tl.constexpr, G: tl.constexpr, RP: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
            PDL: tl.constexpr):
    kv, split = tl.program_id(0), tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()  # q, k and v come from the previous kernel
    r = tl.arange(0, RP)  # row r: query head kv·G + r // T, query row r % T
    g, t = r // T, r % T
    r_ok = r < G * T
    d = tl.arange(0, DP)
    d_ok = d < dim
    q = tl.load(q_ptr + t[:, None] * sq_t + (kv * G + g)[:, None] * sq_h + d[None, :],
                mask=r_ok[:, None] & d_ok[None, :], other=0.0)  # (RP, DP)
    last_seen = tl.load(ids_ptr + t, mask=r_ok, other=-1)  # each row sees keys ≤ its own position
    start = split * chunk
    stop = tl.minimum(start + chunk, tl.load(ids_ptr + T - 1) + 1)  # nothing past the last row's position
    m_i = tl.full((RP,), float("-inf"), tl.float32)
    l_i = tl.zeros((RP,), tl.float32)
    acc = tl.zeros((RP, DP), tl.float32)
    s0 = start
    while s0 < stop:
        s = s0 + tl.arange(0, BLOCK)
        s_ok = s < stop
        k = tl.load(k_ptr + kv * sk_h + s[:, None] * sk_s + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)  # (BLOCK, DP)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (RP, BLOCK); float32 not as TF32
        seen = s_ok[None, :] & (s[None, :] <= last_seen[:, None])
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet stays at 0
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        v = tl.load(v_ptr + kv * sv_h + s[:, None] * sv_s + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
        s0 += BLOCK
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    at = (kv * splits + split) * RP + r  # chunks past the last position store m = −inf, l = 0: weight 0
    tl.store(m_ptr + at, m_i)
    tl.store(l_ptr + at, l_i)
    tl.store(acc_ptr + at[:, None] * DP + d[None, :], acc)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, out_ptr, so_t, splits, dim,
             T: tl.constexpr, G: tl.constexpr, RP: tl.constexpr, DP: tl.constexpr, SP: tl.constexpr,
             PDL: tl.constexpr):
    """One program per query head and row: its chunks combined, M = max m_c,
    out = Σ e^(m_c − M) acc_c / Σ e^(m_c − M) l_c, written as SDPA returns it (the activation dtype)."""
    head, t = tl.program_id(0), tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    c = tl.arange(0, SP)
    c_ok = c < splits
    at = ((head // G) * splits + c) * RP + (head % G) * T + t
    m_c = tl.load(m_ptr + at, mask=c_ok, other=float("-inf"))
    l_c = tl.load(l_ptr + at, mask=c_ok, other=0.0)
    d = tl.arange(0, DP)
    a = tl.load(acc_ptr + at[:, None] * DP + d[None, :], mask=c_ok[:, None], other=0.0)  # (SP, DP)
    weight = tl.exp(m_c - tl.max(m_c, 0))  # every row sees its own position: some chunk has a finite m
    out = tl.sum(a * weight[:, None], 0) / tl.sum(l_c * weight, 0)
    tl.store(out_ptr + t * so_t + head * dim + d, out.to(out_ptr.dtype.element_ty), mask=d < dim)


@triton.jit
def _tile(n, T: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr):
    """This program's BN output columns and the rows (padded to ROWS), each with its in-bounds mask."""
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    r = tl.arange(0, ROWS)
    return cols, cols < n, r, r < T


@triton.jit
def _gate_up(x_ptr, xw_ptr, dx_ptr, xs_ptr, nw_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, mg_ptr, mu_ptr, out_ptr, ws_ptr,
             sem_ptr, eps, hidden, n, sx, sw, so, T: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, ROUNDS: tl.constexpr, STAGES: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr,
             QK: tl.constexpr, Q8: tl.constexpr):
    dt: tl.constexpr = out_ptr.dtype.element_ty
    cols, n_ok, r, r_ok = _tile(n, T, ROWS, BN)
    if Q8:
        gate, up = _gemv2_q8(xw_ptr, dx_ptr, xs_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, mg_ptr, mu_ptr, sw, cols, cols,
                             n_ok, hidden, True, BN, BK, ROUNDS, PDL, QK)
    elif QK:
        gate, up = _gemv2_q4(x_ptr, wg_ptr, wu_ptr, sg_ptr, su_ptr, mg_ptr, mu_ptr, sw, cols, cols, n_ok, hidden, eps,
                             nw_ptr, dt, True, True, BN, BK, ROUNDS, STAGES, PDL, QK)
    else:
        gate, up = _gemv2(x_ptr, sx, wg_ptr, wu_ptr, sw, cols, cols, n_ok, r, r_ok, hidden, eps, nw_ptr, dt, True,
                          True, ROWS, BN, BK, ROUNDS, STAGES, SPLITS, PDL)
    gate, up, last = _split_sum(gate, up, ws_ptr, sem_ptr, True, ROWS, BN, SPLITS)
    gate, up = _rnd(gate, dt), _rnd(up, dt)
    act = _rnd(gate * tl.sigmoid(gate), dt) * up
    tl.store(out_ptr + r[:, None] * so + cols[None, :], act.to(dt), mask=r_ok[:, None] & n_ok[None, :] & last)


@triton.jit
def _gemv_residual(x_ptr, xw_ptr, dx_ptr, xs_ptr, w_ptr, s_ptr, m_ptr, res_ptr, out_ptr, ws_ptr, sem_ptr, k, n, sx,
                   sw, sr, so, T: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   ROUNDS: tl.constexpr, STAGES: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr,
                   QK: tl.constexpr, Q8: tl.constexpr):
    dt: tl.constexpr = out_ptr.dtype.element_ty
    cols, n_ok, r, r_ok = _tile(n, T, ROWS, BN)
    if Q8:
        y, _ = _gemv2_q8(xw_ptr, dx_ptr, xs_ptr, w_ptr, w_ptr, s_ptr, s_ptr, m_ptr, m_ptr, sw, cols, cols, n_ok, k,
                         False, BN, BK, ROUNDS, PDL, QK)
    elif QK:
        y, _ = _gemv2_q4(x_ptr, w_ptr, w_ptr, s_ptr, s_ptr, m_ptr, m_ptr, sw, cols, cols, n_ok, k, 0.0, x_ptr, dt,
                         False, False, BN, BK, ROUNDS, STAGES, PDL, QK)
    else:
        y, _ = _gemv2(x_ptr, sx, w_ptr, w_ptr, sw, cols, cols, n_ok, r, r_ok, k, 0.0, x_ptr, dt, False, False, ROWS,
                      BN, BK, ROUNDS, STAGES, SPLITS, PDL)
    y, _, last = _split_sum(y, y, ws_ptr, sem_ptr, False, ROWS, BN, SPLITS)
    both = r_ok[:, None] & n_ok[None, :] & last
    res = tl.load(res_ptr + r[:, None] * sr + cols[None, :], mask=both, other=0.0).to(tl.float32)
    tl.store(out_ptr + r[:, None] * so + cols[None, :], (res + _rnd(y, dt)).to(dt), mask=both)


class Tiles(NamedTuple):
    """A GEMV's tiling: rows padded to ROWS, BN output columns per program, K split over `splits` programs (a
    grid of column blocks × splits), each reading its share in `rounds` rounds of BK, `stages` rounds' loads in
    flight at once (1: one round at a time)."""

    rows: int
    bn: int
    bk: int
    rounds: int
    stages: int
    splits: int = 1

    def grid(self, n: int) -> tuple[int, int]:
        return triton.cdiv(n, self.bn), self.splits

    def warps(self, two: bool) -> int:
        """Warps per program: DOT_WARPS for a tl.dot tile (16+ rows and columns); on the CUDA cores 8 where a
        program holds more than WIDE weight elements at once (64 per thread at most), else 4 (the default model's
        one-row tiles are all ≤ WIDE, so its measured launches ran 4)."""
        if self.rows >= DOT_ROWS and self.bn >= 16:
            return DOT_WARPS
        return 8 if (2 if two else 1) * self.bn * self.bk > WIDE else 4

    def workspace(self, like: torch.Tensor, n: int, two: bool) -> torch.Tensor:
        """The float32 shares of a split K (`_split_sum`); `like` itself where K is not split (never read)."""
        if self.splits == 1:
            return like
        blocks, splits = self.grid(n)
        return like.new_empty(blocks * splits * (2 if two else 1) * self.rows * self.bn, dtype=torch.float32)


def _k_splits(blocks: int, rounds: int) -> int:
    """How many programs share each column block's K: the fewest that divides its rounds evenly and makes
    SPLIT_PROGRAMS programs in all (the most that divides them if none does); 1 when SPLIT_PROGRAMS is 0 or
    there are more than MAX_BLOCKS blocks. On the default model (30–96 column blocks of 16 on 132 SMs, K in 9 or
    24 rounds of 64) 64 splits q/k/v and o_proj in 3 and down in 2: a graphed verify of 9 / 16 rows took 682 / 778
    µs against 754 / 816 unsplit; 128 and 256 (K 576 in 9 one-round shares) 795–832, and splitting gate/up as well
    cost 25–30 µs more (H200, verify-tiles-smollm2-preset-h200-split.json, …-split-gemv.json)."""
    if not SPLIT_PROGRAMS or blocks > MAX_BLOCKS:
        return 1
    divisors = [d for d in range(1, rounds + 1) if rounds % d == 0]
    return next((d for d in divisors if blocks * d >= SPLIT_PROGRAMS), divisors[-1])


def _tiles(rows: int, n: int, k: int, quant: bool = False, q8: int = 0) -> Tiles:
    """Tiles for a GEMV of `rows` rows, n output columns (q/k/v: rotation pairs) and K = k: whole K in one tile
    where the tile fits (one round of loads per program: these GEMVs are latency-bound), BN output columns per
    program (many programs: on the default model's 576-wide projections 4 columns per program gave 1,035 tok/s,
    8 gave 993 and 16 gave 835, and a tile of 8,192 or 32,768 elements the same 1,034; H200,
    `fused-layer-probe-h200-first.json`); a tl.dot tile's K split over programs (`_k_splits`)."""
    padded = triton.next_power_of_2(rows)
    if q8:  # one decode row over Q4 blocks against x's int8 words (`_gemv2_q8`): Q8_ROWS weight rows a program
        # over q8 (1 or 2) matrices, rounds of Q8_BK, none in flight
        return Tiles(1, max(1, Q8_ROWS // q8), Q8_BK, triton.cdiv(k, Q8_BK), 1)
    if quant:  # one decode row over Q4 blocks (`_gemv2_q4`): rounds of QUANT_BK values, DECODE_STAGES in flight
        bk = min(triton.next_power_of_2(k), QUANT_BK)
        return Tiles(1, BN, bk, triton.cdiv(k, bk), DECODE_STAGES)
    if padded >= DOT_ROWS:  # tl.dot: 16 columns at least, K in rounds of 64, 8 in flight — a graphed verify of the
        # default model (9 / 16 rows) took 741 / 814 µs so, 816 / 836 with rounds of 256 (3 in flight), 1,050 / 1,198
        # with one round of 256 at a time (the first choice), 2,419 / 1,371 with 512 (2 in flight); a plain step
        # 541 (H200, verify-tiles-smollm2-preset-h200-pipelined.json; round one: verify-tiles-smollm2-preset-h200.json)
        bk = min(triton.next_power_of_2(k), DOT_BK)
        rounds = triton.cdiv(k, bk)
        splits = _k_splits(triton.cdiv(n, DOT_BN), rounds)
        return Tiles(padded, DOT_BN, bk, rounds // splits, DOT_STAGES, splits)
    bk = min(triton.next_power_of_2(k), max(16, TILE // (padded * BN)))
    if padded == 1 and k > bk:  # a decode row over several rounds (an 8B's K of 4,096 and 14,336: 2 and 7 rounds of
        # 2,048 one at a time, its projections at 76–80% of copy): rounds of DECODE_BK summed in place (`_gemv2`'s
        # DEFER), DECODE_STAGES in flight; one round, as on the default model, stays as measured
        return Tiles(1, BN, DECODE_BK, triton.cdiv(k, DECODE_BK), DECODE_STAGES)
    return Tiles(padded, BN, bk, triton.cdiv(k, bk), 1)


def _head_tiles(rows: int, heads: int, half: int, k: int) -> Tiles:
    """Tiles of the q/k/v GEMV with one whole head per program (its `half` rotation pairs, a power of two), for the
    per-head norms. A decode's K is split until each program reads HEAD_ROUNDS rounds at most; a tl.dot tile (16+
    rows) keeps the verify's rounds of DOT_BK and split (`_k_splits`), as many rounds in flight as STAGE_BYTES
    holds of the two halves' float32 tiles."""
    padded = triton.next_power_of_2(rows)
    if padded >= DOT_ROWS:
        bk = min(triton.next_power_of_2(k), DOT_BK)
        rounds, stages = triton.cdiv(k, bk), max(1, min(DOT_STAGES, STAGE_BYTES // (2 * half * bk * 4)))
        splits = _k_splits(heads, rounds)
    else:
        bk, stages = min(triton.next_power_of_2(k), max(16, TILE // (padded * half))), 1
        rounds = triton.cdiv(k, bk)
        splits = next(d for d in range(1, rounds + 1) if rounds % d == 0 and rounds // d <= max(1, HEAD_ROUNDS))
    return Tiles(padded, half, bk, rounds // splits, stages, splits)


Matrix = torch.Tensor | QuantWeight  # a projection's weight: its values, or Q4_0/Q4_1 blocks (decode rows only)


class Weights(NamedTuple):
    """One layer's weights as the kernels read them (q, k, v stacked by rows in `qkv`); every matrix's rows are
    contiguous, and gate and up share a row stride and a kind (`weights` checks). A matrix may be Q4_0/Q4_1 blocks
    (`quant_gemv.QuantWeight`, the `quantized` lever's): the layer then takes decode rows only (`max_rows`)."""

    input_norm: torch.Tensor
    qkv: Matrix
    qkv_bias: torch.Tensor | None
    o_proj: Matrix
    post_norm: torch.Tensor
    gate: Matrix
    up: Matrix
    down: Matrix
    eps: float  # every norm's, the per-head ones' too
    q_norm: torch.Tensor | None = None  # (head_dim,): per-head norms of q and k before RoPE (qwen3), or None
    k_norm: torch.Tensor | None = None
    q8: bool = False  # every matrix Q4 blocks, each GEMV's x rounded to int8 words first (`q8_dot`, `_gemv2_q8`)


MATRICES = ("qkv", "o_proj", "gate", "up", "down")


def weights(**named: object) -> Weights:
    """Weights from keyword arguments, each matrix checked for the layout the kernels assume."""
    w = Weights(**named)
    for name in MATRICES:
        m = getattr(w, name)
        if isinstance(m, QuantWeight):
            n, k = m.shape
            if m.qtype not in QK_KINDS:
                raise ValueError(f"fused_layer: {name} is {m.qtype} blocks; expected {' or '.join(QK_KINDS)}")
            parts = [m.quants, m.scales] + ([m.mins] if m.mins is not None else [])
            if any(t.stride(1) != 1 for t in parts) or m.scales.stride(0) != k // 32 or m.quants.stride(0) != k // 2 \
                    or (m.mins is not None and m.mins.stride(0) != k // 32):
                raise ValueError(f"fused_layer: {name}'s blocks are not contiguous rows")
        elif m.stride(1) != 1:
            raise ValueError(f"fused_layer: {name} weight rows are not contiguous")
    if _kind(w.gate) != _kind(w.up) or _blocks(w.gate)[0].stride(0) != _blocks(w.up)[0].stride(0):
        raise ValueError("fused_layer: gate and up weights differ in kind or row stride")
    if w.q8 and not all(isinstance(getattr(w, name), QuantWeight) for name in MATRICES):
        raise ValueError("fused_layer: x as int8 words (q8) needs every matrix as Q4 blocks")
    if w.q8 and w.q_norm is not None:
        raise ValueError("fused_layer: x as int8 words (q8) with per-head q/k norms")
    return w


def _kind(m: Matrix) -> int:
    """0 for values, else the block type's QK (`_gemv2_q4`)."""
    return QK_KINDS[m.qtype] if isinstance(m, QuantWeight) else 0


def _blocks(m: Matrix, words: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, scales, mins) as the kernels take them: the quants (`words`: as int32 words, for `_gemv2_q8`), or the
    values with themselves as unread placeholders; Q4_0's mins are its scales, unread."""
    if isinstance(m, QuantWeight):
        return m.quants.view(torch.int32) if words else m.quants, m.scales, m.mins if m.mins is not None else m.scales
    return m, m, m


def max_rows(w: Weights) -> int:
    """The most rows this layer's kernels take: decode and verify rows, or one row where a matrix is blocks."""
    return 1 if any(isinstance(getattr(w, name), QuantWeight) for name in MATRICES) else MAX_ROWS


class Shape(NamedTuple):
    heads: int
    kv_heads: int
    head_dim: int


@functools.lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (asked once: every layer of every step sizes its grid from it); 4 off CUDA."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _semaphores(device: torch.device) -> torch.Tensor:
    """Column blocks' arrival counts for a split K (`_split_sum`), zero between launches: each launch's last
    arriver zeroes what it counted, and a launch counts only after the previous kernel is done (stream order, and
    PDL's wait ahead of every load in the tl.dot path), so every GEMV of every step shares them. Made once per
    device ("cuda" and "cuda:0" are one), before any capture (graph warm-ups run first), and never freed."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _semaphores_on(device)


@functools.lru_cache(maxsize=None)
def _semaphores_on(device: torch.device) -> torch.Tensor:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("fused_layer: the split-K semaphores must exist before a CUDA graph capture")
    return torch.zeros(MAX_BLOCKS, dtype=torch.int32, device=device)


def _splits(upper: int, kv_heads: int, device: torch.device) -> tuple[int, int]:
    """(chunk, splits): keys per program and programs per KV head for a cache read up to `upper` positions —
    about 2 programs per SM, no chunk shorter than a tile, at most MAX_SPLITS."""
    sms = _sms(device)
    wanted = max(1, min(MAX_SPLITS, triton.cdiv(2 * sms, kv_heads)))
    chunk = triton.cdiv(triton.cdiv(upper, wanted), BLOCK_S) * BLOCK_S
    return chunk, triton.cdiv(upper, chunk)


def layer(x: torch.Tensor, w: Weights, shape: Shape, cos: torch.Tensor, sin: torch.Tensor, ids: torch.Tensor,
          keys: torch.Tensor, values: torch.Tensor, upper: int, pdl: bool = False) -> torch.Tensor:
    """One decoder layer for x (T, hidden), T ≤ MAX_ROWS rows at positions `ids` (T,) on the device: writes
    this layer's k, v (Hkv, S, D cache views) at those positions, attends over keys ≤ each row's position (the
    grid covers `upper` ≥ the last position + 1) and returns the layer's output (T, hidden). `pdl`: every kernel
    launched with programmatic dependent launch (compute capability 9.0+), each waiting on the one before it
    (`griddepcontrol.wait`) only where it first reads that kernel's output."""
    rows, hidden = x.shape
    heads, kv_heads, dim = shape
    group, half = heads // kv_heads, dim // 2
    pairs = (heads + 2 * kv_heads) * half
    qk_norm = w.q_norm is not None and w.k_norm is not None
    if rows > max_rows(w):
        raise ValueError(f"fused_layer: {rows} rows; a layer with blocks takes {max_rows(w)}")
    qkv = _head_tiles(rows, heads + 2 * kv_heads, half, hidden) if qk_norm else _tiles(rows, pairs, hidden,
                                                                                      bool(_kind(w.qkv)), 2 * w.q8)
    q = x.new_empty(rows, heads, dim)
    qkv_w, qkv_s, qkv_m = _blocks(w.qkv, w.q8)
    bias = w.qkv_bias if w.qkv_bias is not None else qkv_w
    q_norm, k_norm = (w.q_norm, w.k_norm) if qk_norm else (w.input_norm, w.input_norm)  # (never read without)
    sem = _semaphores(x.device)
    _qkv_rope_cache[qkv.grid(pairs)](
        x, *_int8_words(x, w.input_norm, w.eps, w.q8, pdl), w.input_norm, qkv_w, qkv_s, qkv_m, bias, q_norm, k_norm,
        cos, sin, ids, q, keys, values, qkv.workspace(x, pairs, True), sem, w.eps, hidden, x.stride(0),
        qkv_w.stride(0), cos.stride(0), q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), values.stride(0),
        values.stride(1), T=rows, ROWS=qkv.rows, HQ=heads, HKV=kv_heads, DIM=dim, BP=qkv.bn, BK=qkv.bk,
        ROUNDS=qkv.rounds, STAGES=qkv.stages, SPLITS=qkv.splits, HAS_BIAS=w.qkv_bias is not None, QK_NORM=qk_norm,
        PDL=pdl, QK=_kind(w.qkv), Q8=w.q8, launch_pdl=pdl, num_warps=qkv.warps(True))
    chunk, splits = _splits(upper, kv_heads, x.device)
    rp, dp = max(ROWS_MIN, triton.next_power_of_2(group * rows)), max(16, triton.next_power_of_2(dim))
    m = torch.empty(kv_heads * splits * rp, device=x.device, dtype=torch.float32)
    l_sum = torch.empty_like(m)
    acc = torch.empty(kv_heads * splits * rp, dp, device=x.device, dtype=torch.float32)
    _attend[(kv_heads, splits)](
        q, keys, values, ids, m, l_sum, acc, q.stride(0), q.stride(1), keys.stride(0), keys.stride(1),
        values.stride(0), values.stride(1), chunk, 1.0 / math.sqrt(dim), splits, dim,
        T=rows, G=group, RP=rp, DP=dp, BLOCK=BLOCK_S, PDL=pdl, launch_pdl=pdl)
    attended = x.new_empty(rows, heads * dim)
    _combine[(heads, rows)](m, l_sum, acc, attended, attended.stride(0), splits, dim, T=rows, G=group, RP=rp, DP=dp,
                            SP=triton.next_power_of_2(splits), PDL=pdl, launch_pdl=pdl)
    h = _residual(attended, w.o_proj, x, sem, pdl, w.q8)
    inter = w.gate.shape[0]
    act = x.new_empty(rows, inter)
    mlp = _tiles(rows, inter, hidden, bool(_kind(w.gate)), 2 * w.q8)
    (gate, gate_s, gate_m), (up, up_s, up_m) = _blocks(w.gate, w.q8), _blocks(w.up, w.q8)
    _gate_up[mlp.grid(inter)](
        h, *_int8_words(h, w.post_norm, w.eps, w.q8, pdl), w.post_norm, gate, up, gate_s, up_s, gate_m, up_m, act,
        mlp.workspace(x, inter, True), sem, w.eps, hidden, inter, h.stride(0), gate.stride(0), act.stride(0), T=rows,
        ROWS=mlp.rows, BN=mlp.bn, BK=mlp.bk, ROUNDS=mlp.rounds, STAGES=mlp.stages, SPLITS=mlp.splits, PDL=pdl,
        QK=_kind(w.gate), Q8=w.q8, launch_pdl=pdl, num_warps=mlp.warps(True))
    return _residual(act, w.down, h, sem, pdl, w.q8)


def _residual(x: torch.Tensor, weight: Matrix, residual: torch.Tensor, sem: torch.Tensor, pdl: bool,
              q8: bool) -> torch.Tensor:
    """residual + x · weightᵀ, the product rounded to the activation dtype first (as stock's linear, then add)."""
    (rows, k), n = x.shape, weight.shape[0]
    out = torch.empty_like(residual)
    t = _tiles(rows, n, k, bool(_kind(weight)), q8)
    data, scales, mins = _blocks(weight, q8)
    _gemv_residual[t.grid(n)](x, *_int8_words(x, None, 0.0, q8, pdl), data, scales, mins, residual, out,
                              t.workspace(x, n, False), sem, k, n, x.stride(0), data.stride(0), residual.stride(0),
                              out.stride(0), T=rows, ROWS=t.rows, BN=t.bn, BK=t.bk, ROUNDS=t.rounds, STAGES=t.stages,
                              SPLITS=t.splits, PDL=pdl, QK=_kind(weight), Q8=q8, launch_pdl=pdl,
                              num_warps=t.warps(False))
    return out


def _int8_words(x: torch.Tensor, norm: torch.Tensor | None, eps: float, q8: bool,
                pdl: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(words, dx, sums): x's one row — RMS-normalised and weighted by `norm` first where given — rounded to int8
    per 32-value block by one launch (`_quantize_row`), for a `_gemv2_q8` GEMV; without q8, x three times (unread
    placeholders)."""
    if not q8:
        return x, x, x
    k = x.shape[1]
    blocks = k // 32
    words = torch.empty(k // 4, device=x.device, dtype=torch.int32)
    dx = torch.empty(blocks, device=x.device, dtype=torch.float32)
    sums = torch.empty(blocks, device=x.device, dtype=torch.int32)
    bb = min(Q8_BLOCKS, triton.next_power_of_2(blocks))
    _quantize_row[(triton.cdiv(blocks, bb),)](x, x if norm is None else norm, words, dx, sums, k, eps,
                                              NORM=norm is not None, BB=bb, ROUNDS=triton.cdiv(k, bb * 32), PDL=pdl,
                                              launch_pdl=pdl)
    return words, dx, sums
