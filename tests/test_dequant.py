"""Torch dequantization against gguf's own numpy reference, type by type."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as reference_dequantize

from kerneltriage.backends.torch.dequant import SUPPORTED_TYPES, dequantize
from kerneltriage.engine.checkpoint import RawTensor
from kerneltriage.engine.gguf_file import SUPPORTED_QTYPES

QUANTIZED = [t for t in SUPPORTED_TYPES if t not in ("F32", "F16", "BF16")]
# Byte offsets of each block's fp16 scale fields (d, dmin); random bytes there could be NaN/inf.
FP16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
               "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
ROWS, BLOCKS_PER_ROW = 3, 2


def random_blocks(qtype: str, rng: np.random.Generator) -> tuple[tuple[int, int], np.ndarray]:
    """(logical shape, raw bytes (rows, bytes_per_row)): random quants, finite moderate fp16 scales."""
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, size=(ROWS * BLOCKS_PER_ROW, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype]:
        scale = rng.uniform(-2.0, 2.0, size=(blocks.shape[0], 1)).astype(np.float16)
        blocks[:, offset:offset + 2] = scale.view(np.uint8)
    return (ROWS, BLOCKS_PER_ROW * block_size), blocks.reshape(ROWS, -1)


def assert_close(ours: np.ndarray, ref: np.ndarray) -> None:
    atol = 1e-6 * max(float(np.abs(ref).max()), 1.0)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=atol)


def test_supported_types_match_what_the_gguf_reader_accepts():
    assert set(SUPPORTED_TYPES) == set(SUPPORTED_QTYPES)


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_quantized_matches_gguf_reference(qtype):
    shape, raw = random_blocks(qtype, np.random.default_rng(0))
    ours = dequantize(RawTensor(qtype, shape, raw), "cpu", torch.float32)
    ref = reference_dequantize(raw, GGMLQuantizationType[qtype])
    assert ours.shape == shape and ours.dtype == torch.float32
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    assert_close(ours.numpy(), ref)


@pytest.mark.parametrize("qtype", ["F32", "F16"])
def test_float_types_are_exact(qtype):
    values = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32 if qtype == "F32" else np.float16)
    ours = dequantize(RawTensor(qtype, values.shape, values), "cpu", torch.float32)
    np.testing.assert_array_equal(ours.numpy(), values.astype(np.float32))


def test_bf16_bits_match_gguf_reference():
    values = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # truncate to bfloat16
    ours = dequantize(RawTensor("BF16", bits.shape, bits), "cpu", torch.float32)
    ref = reference_dequantize(bits.view(np.uint8), GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(ours.numpy(), ref)
    assert np.abs(ref - values).max() < 1e-2 * np.abs(values).max()


def test_read_only_memmap_and_output_dtype(tmp_path):
    shape, raw = random_blocks("Q8_0", np.random.default_rng(3))
    raw.tofile(tmp_path / "q.bin")
    mm = np.memmap(tmp_path / "q.bin", dtype=np.uint8, mode="r").reshape(raw.shape)
    ours = dequantize(RawTensor("Q8_0", shape, mm), "cpu", torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    ref = reference_dequantize(raw, GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours.float().numpy(), torch.from_numpy(ref).bfloat16().float().numpy())


def test_q4_0_nibble_order():
    # Byte i holds value i in its low nibble and value 16+i in its high nibble; d = 0.5.
    low = np.arange(16, dtype=np.uint8)
    high = 15 - low
    block = np.concatenate([np.array([0.5], np.float16).view(np.uint8), low | (high << 4)])
    ours = dequantize(RawTensor("Q4_0", (1, 32), block.reshape(1, 18)), "cpu", torch.float32)
    expected = 0.5 * (np.concatenate([low, high]).astype(np.float32) - 8)
    np.testing.assert_array_equal(ours.numpy()[0], expected)


def test_unsupported_type_is_named():
    with pytest.raises(ValueError, match="Q2_K"):
        dequantize(RawTensor("Q2_K", (1, 256), np.zeros((1, 84), np.uint8)), "cpu", torch.float32)
