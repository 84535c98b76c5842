"""Sparse-V inside split-KV decode attention (the `attn.decode` seam): split_kv_attention.py's kernel with the skip.

Each program runs online softmax over its chunk's key tiles (split_kv_attention.py has the method). After a tile's
scores, p = exp(score − m) against the chunk's running max m; the tile's V rows are read and added only when some
row of the block has p ≥ THRESHOLD. Skipping is sound: the row's final weight is exp(score − M) / L with M ≥ m (the
global max) and L ≥ 1 (the max's own term), so it is at most p < THRESHOLD. The skipped p still count in l (the
normaliser), so the kept weights are the exact ones and the output misses at most keys · THRESHOLD · max|v| —
what the `sparse_v` lever's split design drops, at tile granularity and without a host sync (CUDA graphs capture it).
With the keys split across the SMs a chunk is often a single tile, so a running max that starts at −inf (as in
llama.cpp's sparse-V, one pass over all keys) would never skip; it starts instead at the scores of the first key (a
real model's attention sink) and the last (the newest token), which are lower bounds of the global max.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kerneltriage.engine.kernels import Kernel
from kerneltriage.engine.levers import LEVERS
from kerneltriage.engine.sparsity import SPARSE_THRESHOLD
from kerneltriage.kernels.split_kv_attention import BLOCK_S, _query_rows, _tile_weights, combine, plan


@triton.jit
def _seed(q, k_head, key, mask_ptr, t, smt, sms, row_ok, d, d_ok, sks, skd, scale, HAS_MASK: tl.constexpr):
    """(ROWS,) each row's score for one key, −inf where the row does not see it."""
    k = tl.load(k_head + key * sks + d * skd, mask=d_ok, other=0.0).to(tl.float32)  # (D,)
    score = tl.sum(q.to(tl.float32) * k[None, :], 1) * scale  # (ROWS,)
    seen = row_ok
    if HAS_MASK:
        seen = seen & (tl.load(mask_ptr + t * smt + key * sms, mask=row_ok, other=0) != 0)
    return tl.where(seen, score, float("-inf"))


@triton.jit
def _partial_sparse(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, skipped_ptr,
                    sqh, sqt, sqd, skh, sks, skd, svh, svs, svd, smt, sms,
                    keys, chunk, tiles, head_dim, scale, splits, threshold,
                    G: tl.constexpr, T: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                    HAS_MASK: tl.constexpr):
    kv, split = tl.program_id(0), tl.program_id(1)
    r, t, row_ok, d, d_ok, q = _query_rows(q_ptr, kv, sqh, sqt, sqd, head_dim, G, T, ROWS, D)
    # the running max starts at the scores of the first and the last key (each where the row sees it): lower bounds
    # of the global max that every program knows before its first tile (the first key is usually the attention sink)
    head = k_ptr + kv * skh
    m_i = tl.maximum(_seed(q, head, 0, mask_ptr, t, smt, sms, row_ok, d, d_ok, sks, skd, scale, HAS_MASK),
                     _seed(q, head, keys - 1, mask_ptr, t, smt, sms, row_ok, d, d_ok, sks, skd, scale, HAS_MASK))
    l_i = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D), tl.float32)
    start = split * chunk
    skipped = 0
    tile = 0
    while tile < tiles:
        s = start + tile * BLOCK + tl.arange(0, BLOCK)
        s_ok = s < keys
        # p (ROWS, BLOCK): an upper bound of each key's final weight
        p, alpha, m_i = _tile_weights(q, head, mask_ptr, s, s_ok, t, row_ok, d, d_ok, sks, skd, smt, sms, scale, m_i,
                                      HAS_MASK)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if tl.max(tl.max(p, 1), 0) >= threshold:  # some row needs this tile's V rows
            v = tl.load(v_ptr + kv * svh + s[:, None] * svs + d[None, :] * svd, mask=s_ok[:, None] & d_ok[None, :],
                        other=0.0)  # (BLOCK, D)
            acc += tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            skipped += 1
        tile += 1
    base = (kv * splits + split) * ROWS + r
    tl.store(m_ptr + base, m_i)
    tl.store(l_ptr + base, l_i)
    tl.store(acc_ptr + base[:, None] * D + d[None, :], acc)
    tl.store(skipped_ptr + kv * splits + split, skipped)


def sparse_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                            out: torch.Tensor, threshold: float = SPARSE_THRESHOLD,
                            skipped: torch.Tensor | None = None) -> torch.Tensor:
    """q (1, Hq, T, D), k and v (1, Hkv, S, D), mask (T, S) bool or None → out (1, Hq, T, D), for T ≤ 16, the
    V tiles no row needs left unread; `skipped` (Hkv · splits int32, or None) receives each program's tiles skipped."""
    run = plan(q, k, mask)
    if skipped is None or skipped.numel() < run.kv_heads * run.splits:
        skipped = torch.empty(run.kv_heads * run.splits, device=q.device, dtype=torch.int32)
    _partial_sparse[(run.kv_heads, run.splits)](
        q, k, v, run.mask, run.m, run.l_sum, run.acc, skipped, q.stride(1), q.stride(2), q.stride(3), k.stride(1),
        k.stride(2), k.stride(3), v.stride(1), v.stride(2), v.stride(3), *run.mask_strides, run.keys, run.chunk,
        run.chunk // BLOCK_S, run.dim, 1.0 / math.sqrt(run.dim), run.splits, threshold,
        G=run.group, T=run.rows, ROWS=run.pad_rows, D=run.pad_dim, BLOCK=BLOCK_S, HAS_MASK=mask is not None)
    return combine(run, out)

def _decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            out: torch.Tensor) -> torch.Tensor:
    return sparse_decode_attention(q, k, v, mask, out)


# judged like the sparse_v lever: by its declared metrics, not by a split-KV kernel's logit tolerance
SPARSE_V = Kernel("attn.decode", _decode, name="sparse_v_attention", quality=LEVERS["sparse_v"].quality)
