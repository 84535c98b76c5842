"""Dequantize a RawTensor into an MLX array: float types as they are, Q4_0/Q4_1/Q8_0 through MLX's own
dequantize of the repacked blocks (`quant.py`: llama.cpp's values exactly), every other block type through
`gguf.quants.dequantize` (llama.cpp's numpy reference, vectorized): the same float32 values the torch backend
computes, then cast to the requested dtype.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from kerneltriage.backends.mlx import quant
from kerneltriage.engine.checkpoint import FLOAT_TYPES, RawTensor
from kerneltriage.engine.gguf_file import SUPPORTED_QTYPES


def dequantize(raw: RawTensor, dtype: mx.Dtype) -> mx.array:
    """The tensor's values as `dtype`, in its logical shape (out, in)."""
    if raw.qtype not in SUPPORTED_QTYPES:
        raise ValueError(f"tensor type {raw.qtype}: expected one of {', '.join(SUPPORTED_QTYPES)}")
    if raw.qtype in FLOAT_TYPES:
        host = np.ascontiguousarray(raw.data)
        array = mx.array(host).view(mx.bfloat16) if raw.qtype == "BF16" else mx.array(host)  # BF16: uint16 bits
        return array.reshape(raw.shape).astype(dtype)
    if raw.qtype in quant.NATIVE_TYPES:
        return quant.dequantize(quant.pack(raw), dtype).reshape(raw.shape)
    values = gguf_dequantize(np.asarray(raw.data), GGMLQuantizationType[raw.qtype])  # float32
    return mx.array(values.reshape(raw.shape)).astype(dtype)
