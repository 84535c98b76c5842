"""Roofline arithmetic against hand-computed numbers and against the real models' parameter counts."""

from __future__ import annotations

import pytest
import torch

from conftest import ARCHS, tiny_config, tiny_runner
from kerneltriage.core import roofline
from kerneltriage.engine.presets import PRESETS

# tiny llama (untied): hidden 64, inter 96, 2 layers, 4 heads, 2 KV heads, head_dim 16, vocab 300
LAYER_MATMUL = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96  # q, k, v, o + gate, up, down = 30,720
LAYER = LAYER_MATMUL + 2 * 64  # + two RMSNorms = 30,848
MATRIX = 300 * 64  # embedding = output projection = 19,200


def test_hand_computed_parameter_counts() -> None:
    counts = roofline.param_counts(tiny_config("llama"))
    assert (counts.layer_matmul, counts.layer, counts.embedding, counts.output) == (30_720, 30_848, 19_200, 19_200)
    assert counts.total == 2 * MATRIX + 2 * LAYER + 64 == 100_160
    # one decode token reads both blocks, the final norm, the whole output matrix and one embedding row
    assert roofline.params_read_per_token(tiny_config("llama")) == 2 * LAYER + 64 + MATRIX + 64 == 81_024


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_count_equals_the_torch_model(arch: str) -> None:
    """Biases (qwen2), q/k norms (qwen3) and tied embeddings (qwen*) are all counted, tied ones once."""
    model = tiny_runner(arch).model
    assert roofline.param_counts(model.config).total == sum(p.numel() for p in model.parameters())


def test_presets_have_their_published_parameter_counts() -> None:
    assert roofline.param_counts(PRESETS["llama3-8b"]).total == 8_030_261_248
    assert roofline.param_counts(PRESETS["qwen2.5-0.5b"]).total == 494_032_768  # Qwen2.5-0.5B's model card


def test_kv_bytes() -> None:
    # 2 (K, V) × 2 layers × 2 KV heads × 16 dims × 10 positions × 4 bytes
    assert roofline.kv_bytes(tiny_config("llama"), 10, 4) == 2 * 2 * 2 * 16 * 10 * 4 == 5120


def test_one_decode_token_at_depth_9() -> None:
    cost = roofline.decode_cost(tiny_config("llama"), tokens=1, depth=9, weight_bytes=1000.0, kv_dtype_bytes=4)
    assert cost.bytes == 1000 + 5120  # the token sees 10 positions: the 9 cached and its own
    # 2 FLOPs per weight of both blocks and the output matrix, plus QKᵀ and PV: 4 × L × H × D × 10
    assert cost.flops == 2 * (2 * LAYER_MATMUL + MATRIX) + 4 * 2 * 4 * 16 * 10 == 166_400


def test_decode_steps_sum_their_contexts() -> None:
    config = tiny_config("llama")
    three = roofline.decode_cost(config, 3, 5, 1000.0, 2)
    singles = [roofline.decode_cost(config, 1, 5 + i, 1000.0, 2) for i in range(3)]
    assert three.bytes == pytest.approx(sum(c.bytes for c in singles))
    assert three.flops == pytest.approx(sum(c.flops for c in singles))


def test_prefill_counts_the_causal_triangle_and_one_output_row() -> None:
    cost = roofline.prefill_cost(tiny_config("llama"), tokens=3, depth=2, weight_bytes=1000.0, kv_dtype_bytes=4)
    assert cost.bytes == 1000 + 2 * 2 * 2 * 16 * 5 * 4  # weights once, 5 positions of K and V
    pairs = 3 * 2 + (1 + 2 + 3)  # each query sees the 2 cached keys and itself and the ones before it
    assert cost.flops == 2 * (3 * 2 * LAYER_MATMUL + MATRIX) + 4 * 2 * 4 * 16 * pairs == 413_184


def test_floor_takes_the_slower_ceiling_and_percent() -> None:
    ceilings = roofline.Ceilings(bandwidth=1e9, matmul_flops=1e12, source="measured")
    assert roofline.floor(roofline.Cost(2e9, 1e12), ceilings) == roofline.Floor(2.0, roofline.MEMORY_BOUND)
    assert roofline.floor(roofline.Cost(1e9, 3e12), ceilings) == roofline.Floor(3.0, roofline.COMPUTE_BOUND)
    assert roofline.percent_of_roofline(measured_seconds=8.0, floor_seconds=2.0) == 25.0


def test_llama3_8b_decode_floor_on_the_reference_h200() -> None:
    """bf16 weights read once per token at the measured 4.19 TB/s: ~3.6 ms, i.e. ~279 tok/s."""
    config = PRESETS["llama3-8b"]
    weights = roofline.engine_weight_bytes(config, 2)
    assert weights == pytest.approx(15.01e9, rel=1e-3)
    ceilings = roofline.Ceilings(4.19e12, 784e12, "measured")
    floor = roofline.floor(roofline.decode_cost(config, 1, 0, weights, 2), ceilings)
    assert floor.bound == roofline.MEMORY_BOUND and 1 / floor.seconds == pytest.approx(279, rel=0.01)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        roofline.Ceilings(0.0, 1.0, "measured")
    with pytest.raises(ValueError):
        roofline.decode_cost(tiny_config("llama"), 0, 0, 1.0, 2)
    with pytest.raises(ValueError):
        roofline.percent_of_roofline(0.0, 1.0)


def test_engine_bytes_use_the_run_dtype() -> None:
    config = tiny_config("qwen3")
    assert roofline.engine_weight_bytes(config, torch.bfloat16.itemsize) * 2 == roofline.engine_weight_bytes(config, 4)
