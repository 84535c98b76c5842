"""Preallocated static KV caches with trim (speculative decoding rolls back rejected tokens).

`KVCache` slices by host-side positions (eager: attention reads only the filled prefix).
`StaticKVCache` keeps every shape fixed for graph capture: the position lives in a device tensor and
attention reads a fixed window of slots under a mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch



class Positions(NamedTuple):
    """Where this forward pass's T new tokens go."""

    start: int | None  # first position, when the host knows it (eager); None under graph capture
    ids: torch.Tensor  # (T,) long, on the device
    mask: torch.Tensor | None  # (T, window) bool, True = may attend; static caches only


class KVCache:
    """Keys and values for every layer, allocated once: (L, B, Hkv, S, D) each.

    `length` is how many positions hold valid entries; `trim` moves it back without touching memory.
    """

    WINDOWED = False  # attends over a fixed window of slots (StaticKVCache): a check runs past one

    def __init__(self, shape: tuple[int, int, int, int, int], device: torch.device, dtype: torch.dtype):
        """`shape` (L, B, Hkv, S, D) comes from the model's own attention layers (`Model.cache_shape`)."""
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = shape[3]
        self.length = 0

    def positions(self, start: int, count: int) -> Positions:
        if start + count > self.max_len:
            raise ValueError(f"KV cache full: position {start + count} past its {self.max_len} slots")
        self.length = start + count
        return Positions(start, torch.arange(start, start + count, device=self.keys.device), None)

    def update(self, layer: int, pos: Positions, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, Hkv, T, D) at the step's positions; return this layer's filled prefix."""
        end = pos.start + k.shape[2]
        self.keys[layer, :, :, pos.start:end] = k
        self.values[layer, :, :, pos.start:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def trim(self, length: int) -> None:
        """Forget every position from `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot trim a cache of length {self.length} to {length}")
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class StaticKVCache(KVCache):
    """Fixed shapes for CUDA graphs: while `window` is set, write at `position` (a device scalar set before
    each replay) and attend over the first `window` slots, masking those past the current position.
    With `window` None it behaves like KVCache (eager prefill on the same buffers)."""

    WINDOWED = True

    def __init__(self, shape: tuple[int, int, int, int, int], device: torch.device, dtype: torch.dtype):
        super().__init__(shape, device, dtype)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.window: int | None = None

    def positions(self, start: int, count: int) -> Positions:
        if self.window is None:
            return super().positions(start, count)
        # `start` is ignored on purpose: under capture it would be frozen into the graph.
        ids = self.position + torch.arange(count, device=self.keys.device)  # (T,)
        mask = torch.arange(self.window, device=ids.device).unsqueeze(0) <= ids.unsqueeze(1)  # (T, window)
        return Positions(None, ids, mask)

    def update(self, layer: int, pos: Positions, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.window is None:
            return super().update(layer, pos, k, v)
        self.keys[layer].index_copy_(2, pos.ids, k)
        self.values[layer].index_copy_(2, pos.ids, v)
        return self.keys[layer, :, :, : self.window], self.values[layer, :, :, : self.window]
