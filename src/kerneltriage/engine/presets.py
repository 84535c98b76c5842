"""Presets: real model shapes with random weights. Timing does not depend on weight values;
anything that does (acceptance rates, attention sparsity, text quality) needs a real model."""

from __future__ import annotations

from kerneltriage.core.errors import InputError
from kerneltriage.engine.config import ModelConfig, RopeScaling

PRESET_SEED = 0

PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(
        arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, max_context=8192, rope_theta=100000.0,
        rms_eps=1e-5, tie_embeddings=True, name="smollm2-135m", random_weights=True,
    ),
    "qwen3-0.6b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
        num_heads=16, num_kv_heads=8, head_dim=128, max_context=40960, rope_theta=1000000.0,
        rms_eps=1e-6, tie_embeddings=True, qk_norm=True, name="qwen3-0.6b", random_weights=True,
    ),
    # Qwen2.5-0.5B shapes: biases on q, k and v (qwen2); 14 query heads on 2 KV heads.
    "qwen2.5-0.5b": ModelConfig(
        arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
        num_heads=14, num_kv_heads=2, head_dim=64, max_context=32768, rope_theta=1000000.0,
        rms_eps=1e-6, tie_embeddings=True, attention_bias=True, name="qwen2.5-0.5b", random_weights=True,
    ),
    # Llama-3.1-8B shapes, including its rope scaling.
    "llama3-8b": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, max_context=131072, rope_theta=500000.0,
        rms_eps=1e-5, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192), name="llama3-8b",
        random_weights=True,
    ),
    "qwen3-8b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, max_context=40960, rope_theta=1000000.0,
        rms_eps=1e-6, qk_norm=True, name="qwen3-8b", random_weights=True,
    ),
    # head_dim 320: above every fused SDPA backend's limit on GQA (triage must find the math fallback).
    "hd320-1b": ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=2560, intermediate_size=6912, num_layers=16,
        num_heads=8, num_kv_heads=2, head_dim=320, max_context=8192, rope_theta=10000.0,
        rms_eps=1e-5, name="hd320-1b", random_weights=True,
    ),
}


def get_preset(name: str) -> ModelConfig:
    """The preset's config; an unknown name is an InputError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError(f"preset {name!r}: expected one of {', '.join(PRESETS)}") from None
