"""The MLX step at mlx-lm's op count: RoPE as one `mx.fast.rope` call that is the composed rotation bit for bit on
the CPU (the frequencies are reciprocals the kernel inverts exactly), attention with no mask array where the keys are
the filled prefix, and the op counter (`graph_ops`) that counts each fast call once and every other op it sees."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from conftest import tiny_config  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.backends.mlx.cache import Positions  # noqa: E402
from kerneltriage.backends.mlx.graph_ops import step_ops  # noqa: E402
from kerneltriage.backends.mlx.models.llama import apply_rope, sdpa_attention  # noqa: E402
from kerneltriage.engine.presets import get_preset  # noqa: E402
from kerneltriage.engine.rope import _inv_freq64, rope_frequencies, rope_inv_freq  # noqa: E402

CONFIGS = [get_preset("smollm2-135m"), get_preset("llama3-8b"), tiny_config("qwen3")]


def composed_rope(x: mx.array, start: int, inv_freq: np.ndarray) -> mx.array:
    """The rotation as the torch model composes it: x·cos + rotate_half(x)·sin, angles position·inv_freq."""
    positions = mx.arange(start, start + x.shape[2], dtype=mx.int32).astype(mx.float32)
    angles = positions[:, None] * mx.array(inv_freq)[None, :]  # (T, D/2)
    angles = mx.concatenate([angles, angles], axis=-1)  # (T, D)
    cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + mx.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_inverse_frequencies_are_the_float32_reciprocals_mlx_inverts_exactly(config) -> None:  # noqa: ANN001
    freqs, inv = rope_frequencies(config), rope_inv_freq(config)
    assert np.array_equal(inv, np.float32(1) / freqs)
    assert np.array_equal(inv, (1.0 / freqs.astype(np.float64)).astype(np.float32))  # CUDA's rope: 1.0 / f in double
    nearest = _inv_freq64(config, None).astype(np.float32)
    steps = np.abs(inv.view(np.int32) - nearest.view(np.int32))
    assert steps.max() <= 1  # at most one float32 step from the float64 value rounded
    if config.name == "smollm2-135m":
        assert int((steps == 1).sum()) == 7  # the 7 of 32 that are no float32's reciprocal


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_fast_rope_is_the_composed_rotation_bit_for_bit(config, dtype: str) -> None:  # noqa: ANN001
    freqs, inv = mx.array(rope_frequencies(config)), rope_inv_freq(config)
    x = mx.random.normal((1, 3, 5, config.head_dim), key=mx.random.key(0)).astype(getattr(mx, dtype))
    for start in (0, 1000, 7919):
        expected = np.array(composed_rope(x, start, inv))
        assert np.array_equal(np.array(apply_rope(x, start, freqs)), expected)
        offset = mx.array([start], dtype=mx.int32)  # as a compiled step passes it
        assert np.array_equal(np.array(apply_rope(x, offset, freqs)), expected)


def test_a_block_after_a_filled_cache_takes_the_causal_flag_not_a_mask_array() -> None:
    q, k, v = (mx.random.normal(shape, key=mx.random.key(i)) for i, shape in
               enumerate([(1, 4, 3, 16), (1, 2, 7, 16), (1, 2, 7, 16)]))
    masks = []

    def sdpa(*args, mask=None, **kwargs):  # noqa: ANN002, ANN003, ANN202
        masks.append(mask)
        return mx.fast.scaled_dot_product_attention(*args, mask=mask, **kwargs)

    out = sdpa_attention(q, k, v, Positions(4, mx.arange(4, 7), None), sdpa)
    explicit = mx.arange(7)[None, :] <= mx.arange(3)[:, None] + 4  # (T, S): query i sees keys ≤ start + i
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=explicit)
    assert masks == ["causal"] and np.array_equal(np.array(out), np.array(expected))
    sdpa_attention(q[:, :, :1], k, v, Positions(6, mx.arange(6, 7), None), sdpa)
    assert masks[-1] is None  # one token sees every key


def test_a_step_counts_each_fast_call_once_and_every_other_op() -> None:
    runner = mlx_runner(quantized_checkpoint("llama"), "quantized")
    layers = runner.config.num_layers
    counts = step_ops(runner, "decode", 8)
    assert (counts["rope"], counts["rms_norm"], counts["scaled_dot_product_attention"]) == (2 * layers,
                                                                                            2 * layers + 1, layers)
    assert counts["QuantizedMatmul"] == 7 * layers + 1 and not {"Reshape", "Transpose", "Slice"} & set(counts)
    stock_logits = runner.model.logits
    runner.model.logits = lambda hidden: stock_logits(hidden) * 2.0  # a planted op
    assert step_ops(runner, "decode", 8)["Multiply"] == counts["Multiply"] + 1
