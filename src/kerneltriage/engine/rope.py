"""Rotary embedding frequencies: what each backend's model rotates q and k by, computed once here on the host.

The inverse frequencies are float32 reciprocals of float32 frequencies (inv = fl32(1 / f), f = fl32(θ^(2i/D))), as
Hugging Face divides them: MLX's fused RoPE (`mx.fast.rope`) takes frequencies and rotates by their float32
reciprocals, so with these it computes the same angles as the composed x·cos + rotate_half(x)·sin of the torch
model (bit for bit on the CPU). A float64 inverse frequency rounded to float32 is no float32's reciprocal in 7 of
the default model's 32; the reciprocal of its nearest frequency is then one float32 step away from it, and in the
other 25 it is the same value.
"""

from __future__ import annotations

import math

import numpy as np

from kerneltriage.engine.config import ModelConfig

RECIPROCAL_STEPS = 2  # float32 steps around 1/inv searched for the frequency whose reciprocal is nearest inv
_STEPS = np.array(sorted(range(-RECIPROCAL_STEPS, RECIPROCAL_STEPS + 1), key=abs), dtype=np.int32)  # 0 first


def rope_inv_freq(config: ModelConfig, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Inverse frequencies θ^(-2i/D) in float32, the float32 reciprocals of `rope_frequencies`: (D/2,)."""
    return np.float32(1) / rope_frequencies(config, freq_factors)


def rope_frequencies(config: ModelConfig, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Frequencies θ^(2i/D) in float32 whose float32 reciprocals are nearest the float64 inverse frequencies, with
    Llama-3 scaling (from config.json) or GGUF `rope_freqs` (per-frequency divisors of the inverse): (D/2,)."""
    inv = _inv_freq64(config, freq_factors)
    near = (1.0 / inv).astype(np.float32)
    # the float32s within RECIPROCAL_STEPS of 1/inv, (2n+1, D/2); the first best wins, so ties keep `near`
    candidates = (near.view(np.int32)[None, :] + _STEPS[:, None]).view(np.float32)
    error = np.abs((np.float32(1) / candidates).astype(np.float64) - inv[None, :])
    return candidates[np.argmin(error, axis=0), np.arange(inv.size)]


def _inv_freq64(config: ModelConfig, freq_factors: np.ndarray | None) -> np.ndarray:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if freq_factors is not None:
        return inv_freq / freq_factors.astype(np.float64)
    rs = config.rope_scaling
    if rs is None:
        return inv_freq
    # Llama-3: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    blended = (1 - smooth) * inv_freq / rs.factor + smooth * inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, blended, scaled)
