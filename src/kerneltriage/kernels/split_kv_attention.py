"""Split-KV decode attention for batch 1 with grouped KV heads (flash-decoding), the `attn.decode` seam.

Why: under the best lever set the default model's decode attention is masked SDPA with one block per KV head —
3 blocks on an H200's 132 SMs, each scanning the whole cache window alone (~0.9 ms per token per 512 positions of
context, measured). Here every KV head's G query heads × T rows form one block of rows (K and V are read once for
all of them), the keys are split into chunks across the SMs, and a second small kernel reduces the chunks.

Partial (one program per KV head and chunk): online softmax over the chunk's key tiles,
  m = max score, l = Σ exp(score − m), acc = Σ exp(score − m) · v,
combine (one program per query row): M = max_c m_c, out = Σ_c exp(m_c − M) acc_c / Σ_c exp(m_c − M) l_c.
A chunk whose keys are all masked for a row has m = −inf and weight 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kerneltriage.engine.kernels import Kernel

BLOCK_S = 64  # keys per tile
ROWS_MIN = 16  # tl.dot wants at least 16 rows
WAVES = 4  # chunks × KV heads ≈ this many programs per SM


@triton.jit
def _query_rows(q_ptr, kv, sqh, sqt, sqd, head_dim, G: tl.constexpr, T: tl.constexpr, ROWS: tl.constexpr,
                D: tl.constexpr):
    """The block's rows (row r: query head kv·G + r // T, query row r % T) and their queries, (ROWS, D)."""
    r = tl.arange(0, ROWS)
    g, t = r // T, r % T
    row_ok = r < G * T
    d = tl.arange(0, D)
    d_ok = d < head_dim
    q = tl.load(q_ptr + (kv * G + g)[:, None] * sqh + t[:, None] * sqt + d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    return r, t, row_ok, d, d_ok, q


@triton.jit
def _tile_weights(q, k_head, mask_ptr, s, s_ok, t, row_ok, d, d_ok, sks, skd, smt, sms, scale, m_i,
                  HAS_MASK: tl.constexpr):
    """One key tile's online-softmax step: (p, alpha, m_new) — each row's exp(score − m_new) over the tile
    (ROWS, BLOCK), the factor its running sums are rescaled by, and its new running max."""
    k = tl.load(k_head + s[:, None] * sks + d[None, :] * skd, mask=s_ok[:, None] & d_ok[None, :],
                other=0.0)  # (BLOCK, D)
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (ROWS, BLOCK); float32 not as TF32
    seen = row_ok[:, None] & s_ok[None, :]
    if HAS_MASK:
        seen = seen & (tl.load(mask_ptr + t[:, None] * smt + s[None, :] * sms, mask=seen, other=0) != 0)
    scores = tl.where(seen, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet stays at 0
    return tl.exp(scores - m_safe[:, None]), tl.exp(m_i - m_safe), m_new


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
             sqh, sqt, sqd, skh, sks, skd, svh, svs, svd, smt, sms,
             keys, chunk, tiles, head_dim, scale, splits,
             G: tl.constexpr, T: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
             HAS_MASK: tl.constexpr):
    kv, split = tl.program_id(0), tl.program_id(1)
    r, t, row_ok, d, d_ok, q = _query_rows(q_ptr, kv, sqh, sqt, sqd, head_dim, G, T, ROWS, D)
    m_i = tl.full((ROWS,), float("-inf"), tl.float32)
    l_i = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D), tl.float32)
    start = split * chunk
    tile = 0
    while tile < tiles:  # the chunk's key tiles (chunk = tiles · BLOCK); the last chunk may run short
        s = start + tile * BLOCK + tl.arange(0, BLOCK)
        s_ok = s < keys
        p, alpha, m_i = _tile_weights(q, k_ptr + kv * skh, mask_ptr, s, s_ok, t, row_ok, d, d_ok, sks, skd, smt, sms,
                                      scale, m_i, HAS_MASK)
        v = tl.load(v_ptr + kv * svh + s[:, None] * svs + d[None, :] * svd, mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)  # (BLOCK, D)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        tile += 1
    base = (kv * splits + split) * ROWS + r
    tl.store(m_ptr + base, m_i)
    tl.store(l_ptr + base, l_i)
    tl.store(acc_ptr + base[:, None] * D + d[None, :], acc)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, out_ptr, soh, sot, sod, head_dim, splits,
             G: tl.constexpr, T: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    kv, r = tl.program_id(0), tl.program_id(1)
    c = tl.arange(0, SPLITS)
    c_ok = c < splits
    base = (kv * splits + c) * ROWS + r
    m = tl.load(m_ptr + base, mask=c_ok, other=float("-inf"))
    l_c = tl.load(l_ptr + base, mask=c_ok, other=0.0)
    top = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))  # (SPLITS,)
    d = tl.arange(0, D)
    acc = tl.load(acc_ptr + base[:, None] * D + d[None, :], mask=c_ok[:, None], other=0.0)  # (SPLITS, D)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_c * w, 0)
    head, row = kv * G + r // T, r % T
    tl.store(out_ptr + head * soh + row * sot + d * sod, out.to(out_ptr.dtype.element_ty), mask=d < head_dim)


def _splits(keys: int, kv_heads: int, device: torch.device) -> int:
    """Chunks of keys per KV head: enough programs to fill the SMs a few times over, none emptier than a tile."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(triton.cdiv(keys, BLOCK_S), triton.cdiv(WAVES * sms, kv_heads)))


class Plan(NamedTuple):
    """One call's launch shape and its partial buffers (each KV head's keys in `splits` chunks of `chunk` keys)."""

    group: int
    rows: int
    dim: int
    kv_heads: int
    keys: int
    pad_rows: int
    pad_dim: int
    splits: int
    chunk: int
    m: torch.Tensor
    l_sum: torch.Tensor
    acc: torch.Tensor
    mask: torch.Tensor  # the mask, or an unused pointer when there is none
    mask_strides: tuple[int, int]


def plan(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> Plan:
    """The chunks and buffers for q (1, Hq, T, D) against k (1, Hkv, S, D)."""
    _, heads, rows, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    group = heads // kv_heads
    pad_rows, pad_dim = max(ROWS_MIN, triton.next_power_of_2(group * rows)), max(16, triton.next_power_of_2(dim))
    splits = _splits(keys, kv_heads, q.device)
    chunk = triton.cdiv(triton.cdiv(keys, splits), BLOCK_S) * BLOCK_S
    splits = triton.cdiv(keys, chunk)
    m = torch.empty(kv_heads * splits * pad_rows, device=q.device, dtype=torch.float32)
    acc = torch.empty(kv_heads * splits * pad_rows, pad_dim, device=q.device, dtype=torch.float32)
    return Plan(group, rows, dim, kv_heads, keys, pad_rows, pad_dim, splits, chunk, m, torch.empty_like(m), acc,
                mask if mask is not None else m, mask.stride() if mask is not None else (0, 0))


def combine(run: Plan, out: torch.Tensor) -> torch.Tensor:
    """The chunks' partial sums into out (1, Hq, T, D)."""
    _combine[(run.kv_heads, run.group * run.rows)](
        run.m, run.l_sum, run.acc, out, out.stride(1), out.stride(2), out.stride(3), run.dim, run.splits,
        G=run.group, T=run.rows, ROWS=run.pad_rows, D=run.pad_dim, SPLITS=triton.next_power_of_2(run.splits))
    return out


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     out: torch.Tensor) -> torch.Tensor:
    """q (1, Hq, T, D), k and v (1, Hkv, S, D), mask (T, S) bool or None → out (1, Hq, T, D), for T ≤ 16."""
    run = plan(q, k, mask)
    _partial[(run.kv_heads, run.splits)](
        q, k, v, run.mask, run.m, run.l_sum, run.acc, q.stride(1), q.stride(2), q.stride(3), k.stride(1),
        k.stride(2), k.stride(3), v.stride(1), v.stride(2), v.stride(3), *run.mask_strides, run.keys, run.chunk,
        run.chunk // BLOCK_S, run.dim, 1.0 / math.sqrt(run.dim), run.splits,
        G=run.group, T=run.rows, ROWS=run.pad_rows, D=run.pad_dim, BLOCK=BLOCK_S, HAS_MASK=mask is not None)
    return combine(run, out)

SPLIT_KV = Kernel("attn.decode", decode_attention, name="split_kv_attention")
