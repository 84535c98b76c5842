"""Dequantize a RawTensor on a torch device: upload the stored bytes, then unpack whole blocks at once.

Block layouts follow `gguf/quants.py` (llama.cpp's reference); all arithmetic is float32 in the same order
as there, so results match it to the bit on CPU, then are cast to the requested dtype.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from kerneltriage.engine.checkpoint import RawTensor

QK_K = 256  # values per K-quant super-block


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of each block, as float32 of shape (n_blocks, 1)."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


def _bits(x: torch.Tensor, width: int, shifts: Sequence[int], mask: int) -> torch.Tensor:
    """Unpack bit fields: bytes (n, g*width) → (n, g*len(shifts), width), group j's field s at row j*len(shifts)+s."""
    n = x.shape[0]
    grouped = x.reshape(n, -1, width)  # (n, g, width)
    # One shift per field over whole tensors (a broadcast uint8 shift is ~7× slower on CPU).
    fields = torch.stack([(grouped >> s) & mask for s in shifts], dim=2)  # (n, g, S, width)
    return fields.reshape(n, -1, width)


def _high_bits32(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1: the 4-byte little-endian bit mask → (n, 32), bit j of the uint32 at column j."""
    return _bits(qh, 1, range(8), 1).reshape(qh.shape[0], 32)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes → 8 six-bit scales and 8 six-bit mins per super-block, each (n, 8) float32."""
    s = scales.reshape(-1, 3, 4)  # rows: low bits of scales, low bits of mins, high nibbles of both
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float(), mn.float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    # [d f16][32 × int8]: x = d·q
    return b[:, 2:].view(torch.int8).float() * _f16(b, 0)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    # [d f16][16 bytes: low nibbles are values 0..15, high nibbles 16..31]: x = d·(q − 8)
    q = _bits(b[:, 2:], 16, (0, 4), 0x0F).reshape(-1, 32).float() - 8
    return _f16(b, 0) * q


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    # [d f16][m f16][16 bytes of nibbles]: x = d·q + m
    q = _bits(b[:, 4:], 16, (0, 4), 0x0F).reshape(-1, 32).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    # [d f16][qh: 32 fifth bits][16 bytes of nibbles]: x = d·(q − 16)
    q = _bits(b[:, 6:], 16, (0, 4), 0x0F).reshape(-1, 32) | (_high_bits32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.float() - 16)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    # [d f16][m f16][qh: 32 fifth bits][16 bytes of nibbles]: x = d·q + m
    q = _bits(b[:, 8:], 16, (0, 4), 0x0F).reshape(-1, 32) | (_high_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    # [d f16][dmin f16][12 bytes scales/mins][128 bytes: 8 sub-blocks of 32 nibbles]: x = d·sc·q − dmin·m
    sc, mn = _k_scales(b[:, 4:16])
    q = _bits(b[:, 16:], 32, (0, 4), 0x0F).float()  # (n, 8, 32)
    d = (_f16(b, 0) * sc).unsqueeze(-1)  # (n, 8, 1)
    dm = (_f16(b, 2) * mn).unsqueeze(-1)
    return (d * q - dm).reshape(-1, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    # Q4_K plus [32 bytes qh]: bit s of qh byte j is the fifth bit of sub-block s, value j.
    sc, mn = _k_scales(b[:, 4:16])
    ql = _bits(b[:, 48:], 32, (0, 4), 0x0F)  # (n, 8, 32)
    qh = _bits(b[:, 16:48], 32, range(8), 1)  # (n, 8, 32)
    q = (ql | (qh << 4)).float()
    d = (_f16(b, 0) * sc).unsqueeze(-1)  # (n, 8, 1)
    dm = (_f16(b, 2) * mn).unsqueeze(-1)
    return (d * q - dm).reshape(-1, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    # [128 bytes ql: low 4 bits][64 bytes qh: high 2 bits][16 × int8 scales][d f16]: x = d·scale·(q − 32)
    n = b.shape[0]
    ql = _bits(b[:, :128], 64, (0, 4), 0x0F).reshape(n, 8, 32)
    qh = _bits(b[:, 128:192], 32, (0, 2, 4, 6), 0x03)  # (n, 8, 32)
    q = ((ql | (qh << 4)).float() - 32).reshape(n, 16, 16)  # 16 sub-blocks of 16 values
    scales = b[:, 192:208].view(torch.int8).float()
    d = (_f16(b, 208) * scales).unsqueeze(-1)  # (n, 16, 1)
    return (d * q).reshape(n, QK_K)


# qtype → (bytes per block, unpack (n_blocks, bytes) → (n_blocks, values) float32)
_BLOCKS: dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {
    "Q8_0": (34, _q8_0),
    "Q4_0": (18, _q4_0),
    "Q4_1": (20, _q4_1),
    "Q5_0": (22, _q5_0),
    "Q5_1": (24, _q5_1),
    "Q4_K": (144, _q4_k),
    "Q5_K": (176, _q5_k),
    "Q6_K": (210, _q6_k),
}
_FLOATS = ("F32", "F16", "BF16")
SUPPORTED_TYPES: tuple[str, ...] = (*_FLOATS, *_BLOCKS)


def dequantize(raw: RawTensor, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """The tensor's values on `device` as `dtype`, in its logical shape (out, in)."""
    if raw.qtype not in SUPPORTED_TYPES:
        raise ValueError(f"tensor type {raw.qtype}: expected one of {', '.join(SUPPORTED_TYPES)}")
    host = raw.data.view(np.int16) if raw.qtype == "BF16" else raw.data  # torch has no uint16 view to bfloat16
    # torch.from_numpy refuses read-only arrays (file memmaps) without a warning; copy those once on the host.
    host = host if host.flags.writeable and host.flags.c_contiguous else np.array(host)
    data = torch.from_numpy(host).to(device)
    if raw.qtype in _FLOATS:
        # F16/BF16 values are exact in float32, so one direct cast rounds exactly as float32-then-cast would.
        return (data.view(torch.bfloat16) if raw.qtype == "BF16" else data).reshape(raw.shape).to(dtype)
    block_bytes, unpack = _BLOCKS[raw.qtype]
    blocks = data.reshape(-1, block_bytes)  # (n_blocks, block_bytes)
    return unpack(blocks).reshape(raw.shape).to(dtype)
