"""GGUF's Q4_0, Q4_1 and Q8_0 blocks in MLX's affine layout, and the modules that multiply by them as they are.

MLX reads these three block types natively (`mx.load` of a .gguf): 32 values per group, w = scale·q + bias with q
unsigned, packed little-endian into uint32 words. The repacking here produces the same arrays, byte for byte
(a test checks it against `mx.load` on the real model), from the engine's RawTensors: one loading path for every
source, with llama's Q/K row permutation already undone by the engine.

The values are llama.cpp's exactly: Q4_0 d·(q − 8) = d·q + (−8d), Q4_1 d·q + m, Q8_0 d·q = d·(q + 128) + (−128d);
d·q is exact in float32 (an 11-bit mantissa times a value below 256) and −8d, −128d are exact in float16, so
scale·q + bias rounds once, where llama.cpp's formula rounds once too.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kerneltriage.engine.checkpoint import RawTensor

GROUP = 32  # values per GGUF block = MLX group size
# qtype → (bytes per block, bits per value, byte offset of the values, offset of the min (None: a fixed bias))
BLOCKS = {"Q4_0": (18, 4, 2, None), "Q4_1": (20, 4, 4, 2), "Q8_0": (34, 8, 2, None)}
NATIVE_TYPES = tuple(BLOCKS)


@dataclass(frozen=True)
class Packed:
    """One quantized matrix (rows, cols) in MLX's layout: weight uint32 (rows, cols·bits/32), scales and biases
    (rows, cols/32) (float16 as stored in the GGUF)."""

    weight: mx.array
    scales: mx.array
    biases: mx.array
    bits: int

    def __post_init__(self) -> None:
        if self.bits not in (4, 8) or self.scales.shape != self.biases.shape:
            raise ValueError(f"packed weight: bits {self.bits}, scales {self.scales.shape}, biases {self.biases.shape}")

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales.nbytes + self.biases.nbytes


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 field at byte `start` of each block: (n_blocks,)."""
    return blocks[:, start:start + 2].copy().view(np.float16)[:, 0]


def pack(raw: RawTensor) -> Packed:
    """A Q4_0/Q4_1/Q8_0 RawTensor (rows, bytes per row) → MLX's layout, vectorized over every block."""
    block_bytes, bits, start, min_at = BLOCKS[raw.qtype]
    rows = raw.data.shape[0]
    blocks = np.asarray(raw.data).reshape(-1, block_bytes)  # (n_blocks, block_bytes)
    d = _f16(blocks, 0)
    if bits == 8:
        values = (blocks[:, start:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)  # (n, 32): q + 128
        bias = -128 * d
    else:  # 16 bytes: low nibbles are values 0..15, high nibbles 16..31; MLX wants value 2i in byte i's low nibble
        nibbles = blocks[:, start:]
        ordered = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)  # (n, 32) in value order
        values = (ordered[:, 0::2] | (ordered[:, 1::2] << 4)).astype(np.uint8)  # (n, 16)
        bias = _f16(blocks, min_at) if min_at is not None else -8 * d
    words = np.ascontiguousarray(values.reshape(rows, -1)).view(np.uint32)  # (rows, cols·bits/32)
    return Packed(mx.array(words), mx.array(d.reshape(rows, -1)), mx.array(bias.reshape(rows, -1)), bits)


def dequantize(packed: Packed, dtype: mx.Dtype) -> mx.array:
    """The values in `dtype`, computed in float32 (scales and biases upcast exactly): llama.cpp's own values."""
    out = mx.dequantize(packed.weight, packed.scales.astype(mx.float32), packed.biases.astype(mx.float32),
                        group_size=GROUP, bits=packed.bits)
    return out.astype(dtype)


class QuantizedLinear(nn.Module):
    """y = x·Wᵀ (+ bias) with W kept as GGUF blocks: `mx.quantized_matmul` dequantizes groups on the fly."""

    def __init__(self, weight: mx.array, scales: mx.array, biases: mx.array, bits: int,
                 bias: mx.array | None = None) -> None:
        super().__init__()
        self.weight, self.scales, self.biases, self.bits = weight, scales, biases, bits
        if bias is not None:
            self.bias = bias

    @classmethod
    def of(cls, packed: Packed, dtype: mx.Dtype, bias: mx.array | None = None) -> "QuantizedLinear":
        """Scales and biases held in the run dtype: exact copies of the stored float16 in float32 or float16."""
        return cls(packed.weight, packed.scales.astype(dtype), packed.biases.astype(dtype), packed.bits, bias)

    def matmul(self, x: mx.array) -> mx.array:
        return mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True, group_size=GROUP,
                                   bits=self.bits)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.matmul(x)
        return y + self["bias"] if "bias" in self else y


class QuantizedEmbedding(QuantizedLinear):
    """Rows of a quantized table, dequantized on lookup (as the tied output head: `QuantizedLinear` over the same
    arrays)."""

    def __call__(self, tokens: mx.array) -> mx.array:
        return mx.dequantize(self.weight[tokens], self.scales[tokens], self.biases[tokens], group_size=GROUP,
                             bits=self.bits)
