"""GGUF blocks repacked for torch's int4 matmuls: Q4_0 / Q4_1 / Q8_0 for the CPU's (`aten._weight_int4pack_mm_for_cpu`,
the `quantized` lever's decode GEMV there), Q4_0 / Q4_1 for CUDA's (`aten._weight_int4pack_mm`, gpt-fast's tinygemm:
the `int4mm` lever, the library's path beside our Triton GEMV).

That kernel computes x · Wᵀ with W[n, k] = (q − 8)·s + z, q a 4-bit value and (s, z) one scale and zero per group
of 32 values along k, in the activations' dtype. Its bf16 path is vectorized (a 2-core EPYC: 30 of the default
model's gate projections in 1.7 ms on one core, against 20 ms for bf16 `F.linear` and 9.8 ms for float32); its
float32 and fp16 paths are scalar (30–80× slower), so the lever takes it only for bf16 activations.

GGUF's blocks are 32 values with their own scales, so the repacking is exact up to the scales' bf16 rounding:
- Q4_0: d·(q − 8) → s = d, z = 0;
- Q4_1: d·q + m = d·(q − 8) + (m + 8d) → s = d, z = m + 8d;
- Q8_0: d·q with q int8 → u = q + 128 = 16h + l (two nibbles), d·q = 16d·(h − 8) + d·(l − 8) + 8d: the row becomes 2K
  4-bit values [h | l], groups of h with s = 16d, z = 0 and of l with s = d, z = 8d (one call, K doubled).
The bf16 scales round d as a bf16 model's weights round each value (the relative error of either is ≤ 2⁻⁹).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from kerneltriage.engine.checkpoint import BLOCK_TYPES, RawTensor

GROUP = 32  # values per GGUF block = per int4 group
KINDS = BLOCK_TYPES
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
COMPUTE = torch.bfloat16  # the only activation dtype its kernel vectorizes
PACK_ROWS = 8192  # rows packed at a time: the packer takes int32 values (4 bytes a 4-bit value: Gemma-3's 262k-row
# head made 1.3 GB of them at once); its layout is per 64 rows, so chunks of a multiple of 64 pack exactly the same


class Int4Weight(NamedTuple):
    packed: torch.Tensor  # (N, K'/2) uint8 in the kernel's own layout (K' = K; 2K for Q8_0)
    scale_zeros: torch.Tensor  # (K'/32, N, 2) bf16: (s, z) per group
    shape: tuple[int, int]  # (N, K): the logical weight


def pack(raws: Sequence[RawTensor]) -> Int4Weight:
    """Stored Q4_0/Q4_1/Q8_0 tensors of one type and width (rows of blocks), stacked by rows in order, as the int4
    kernel's packed weight and bf16 scales: one tensor, or a layer's q, k and v (packed_qkv under quantized)."""
    kinds = {raw.qtype for raw in raws}
    if len(kinds) != 1 or not kinds <= set(KINDS) or len({raw.shape[1] for raw in raws}) != 1:
        raise ValueError(f"tensor types {sorted(kinds)}, widths {sorted({raw.shape[1] for raw in raws})}: expected "
                         f"one of {', '.join(KINDS)} and one width")
    parts = [_nibbles(raw) for raw in raws]
    values, scales, zeros = (torch.cat([part[i] for part in parts]) for i in range(3))  # stacked by rows
    packed = torch.cat([torch.ops.aten._convert_weight_to_int4pack_for_cpu(values[i:i + PACK_ROWS].to(torch.int32), 1)
                        for i in range(0, values.shape[0], PACK_ROWS)])
    # (N, groups) twice → (groups, N, 2)
    scale_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(COMPUTE)
    return Int4Weight(packed, scale_zeros, (values.shape[0], raws[0].shape[1]))


def _nibbles(raw: RawTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tensor's 4-bit values (N, K') and the scales and zeros (N, K'/32) of their groups (module docstring)."""
    n, k = raw.shape
    blocks = torch.from_numpy(np.array(raw.data)).view(n, k // GROUP, _BLOCK_BYTES[raw.qtype])  # (N, K/32, bytes)
    d = blocks[:, :, 0:2].contiguous().view(torch.float16).float()[..., 0]  # (N, K/32)
    if raw.qtype == "Q8_0":
        u = blocks[:, :, 2:] ^ 0x80  # int8 q + 128 as uint8: (N, K/32, 32)
        values = torch.cat([(u >> 4).reshape(n, k), (u & 0x0F).reshape(n, k)], dim=1)  # (N, 2K): [h | l]
        return values, torch.cat([16 * d, d], dim=1), torch.cat([torch.zeros_like(d), 8 * d], dim=1)  # (N, 2K/32)
    first = 4 if raw.qtype == "Q4_1" else 2
    nibbles = blocks[:, :, first:]  # (N, K/32, 16): low nibbles are values 0..15, high ones 16..31
    values = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2).reshape(n, k)
    m = blocks[:, :, 2:4].contiguous().view(torch.float16).float()[..., 0] if raw.qtype == "Q4_1" else None
    return values, d, torch.zeros_like(d) if m is None else m + 8 * d


def int4_product(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x (M, K) bf16 → x·Wᵀ (M, N) bf16 through the int4 kernel (a Q8_0 weight's two halves read the same x)."""
    k_packed = w.packed.shape[1] * 2
    if k_packed != w.shape[1]:
        x = torch.cat([x, x], dim=1)  # (M, 2K): the high nibbles' groups, then the low ones'
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, GROUP, w.scale_zeros)


# CUDA (tinygemm): the packer takes (N, K/2) uint8, two values a byte, the even one in the high nibble (torchao's
# `(w[:, ::2] << 4) | w[:, 1::2]`), and lays them out per 8 rows and K tiles of 16 × INNER_K; N a multiple of 8
INNER_K = (8, 4, 2)  # the K tiles tried, widest first: K must be a multiple of 16 × the tile
CUDA_KINDS = ("Q4_0", "Q4_1")  # Q8_0's two halves would need x twice (a copy a call): it stays on the Triton GEMV


def cuda_packable(qtype: str, shape: tuple[int, int]) -> bool:
    """A weight of this type and (N, K) that CUDA's int4 matmul takes."""
    n, k = shape
    return qtype in CUDA_KINDS and n % 8 == 0 and k % (16 * INNER_K[-1]) == 0


def pack_blocks_cuda(qtype: str, scales: torch.Tensor, mins: torch.Tensor | None, quants: torch.Tensor,
                     shape: tuple[int, int]) -> Int4Weight:
    """A Q4_0/Q4_1 weight split into its blocks (`kernels/quant_gemv.split_blocks`: scales and mins (N, K/32)
    float16, quants (N, K/2) uint8 in GGUF's nibble order, `quant_gemv.nibbles`) as CUDA's int4 matmul takes it, on
    the blocks' device; the scales and zeros as the module docstring says."""
    n, k = shape
    if not cuda_packable(qtype, shape):
        raise ValueError(f"{qtype} ({n}, {k}): expected one of {', '.join(CUDA_KINDS)}, N a multiple of 8 and K of "
                         f"{16 * INNER_K[-1]}")
    values, d, zeros = cuda_parts(scales, mins, quants, shape)
    pairs = ((values[:, ::2] << 4) | values[:, 1::2]).to(torch.uint8).contiguous()
    inner = next(t for t in INNER_K if k % (16 * t) == 0)
    packed = torch.ops.aten._convert_weight_to_int4pack(pairs, inner)
    scale_zeros = torch.stack([d, zeros], dim=-1).transpose(0, 1).contiguous().to(COMPUTE)  # (K/32, N, 2)
    return Int4Weight(packed, scale_zeros, shape)


def cuda_parts(scales: torch.Tensor, mins: torch.Tensor | None, quants: torch.Tensor,
               shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weight's 4-bit values (N, K) in order, each group's float32 scale and zero (N, K/32): W = (q − 8)·s + z."""
    from kerneltriage.kernels.quant_gemv import nibbles  # (Triton's module: imported where CUDA's path runs)

    n, k = shape
    values = nibbles(quants, n).reshape(n, k)
    d = scales.float()
    return values, d, torch.zeros_like(d) if mins is None else mins.float() + 8 * d


def int4_product_cuda(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x (M, K) bf16 → x·Wᵀ (M, N) bf16 through CUDA's int4 matmul."""
    return torch.ops.aten._weight_int4pack_mm(x.contiguous(), w.packed, GROUP, w.scale_zeros)
