"""Preallocated static KV cache with trim (speculative decoding rolls back rejected tokens)."""

from __future__ import annotations

import torch

from kerneltriage.engine.config import ModelConfig


class KVCache:
    """Keys and values for every layer, allocated once: (L, B, Hkv, S, D) each.

    `length` is how many positions hold valid entries; `trim` moves it back without touching memory.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int, device: torch.device, dtype: torch.dtype):
        if max_len > config.max_context:
            raise ValueError(f"cache length {max_len} exceeds the model's context of {config.max_context}")
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, Hkv, T, D) at positions start…start+T-1; return the filled prefix of this layer."""
        end = start + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache full: position {end} past its {self.max_len} slots")
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        if layer == self.keys.shape[0] - 1:
            self.length = end
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def trim(self, length: int) -> None:
        """Forget every position from `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot trim a cache of length {self.length} to {length}")
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes
