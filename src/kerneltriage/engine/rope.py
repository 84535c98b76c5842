"""Rotary embedding frequencies: what each backend's model rotates q and k by, computed once here on the host."""

from __future__ import annotations

import math

import numpy as np

from kerneltriage.engine.config import ModelConfig


def rope_inv_freq(config: ModelConfig, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Inverse frequencies θ^(-2i/D) in float32 (computed in float64), with Llama-3 scaling (from config.json) or
    GGUF `rope_freqs` (per-frequency divisors): (D/2,)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if freq_factors is not None:
        return (inv_freq / freq_factors.astype(np.float64)).astype(np.float32)
    rs = config.rope_scaling
    if rs is None:
        return inv_freq.astype(np.float32)
    # Llama-3: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    blended = (1 - smooth) * inv_freq / rs.factor + smooth * inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, blended, scaled).astype(np.float32)
