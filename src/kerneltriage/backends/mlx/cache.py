"""Preallocated KV caches with trim (speculative decoding rolls back rejected tokens), as in the torch backend.

`KVCache` writes by host-side positions (eager: attention reads only the filled prefix). `StaticKVCache` keeps
every shape fixed for `mx.compile`: the position is an array given to each call and attention reads a fixed
window of slots under a mask, so one compiled trace serves every step of a window.

Each layer's keys and values are arrays in a list: a write replaces the list's element with the updated array
(MLX arrays are values; slice assignment builds an update the runtime does in place when nothing else holds
the old one), and a compiled step takes the lists as its state.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx


class Positions(NamedTuple):
    """Where this forward pass's T new tokens go."""

    start: int | None  # first position, when the host knows it (eager); None under compile
    ids: mx.array  # (T,) int32
    mask: mx.array | None  # (T, window) bool, True = may attend; static caches only


class KVCache:
    """Keys and values for every layer, allocated once: L arrays (B, Hkv, S, D) each.

    `length` is how many positions hold valid entries; `trim` moves it back without touching memory.
    """

    WINDOWED = False  # attends over a fixed window of slots (StaticKVCache): a check runs past one

    def __init__(self, shape: tuple[int, int, int, int, int], dtype: mx.Dtype) -> None:
        """`shape` (L, B, Hkv, S, D) comes from the model's own attention layers (`Model.cache_shape`)."""
        layers, *per_layer = shape
        self.keys = [mx.zeros(per_layer, dtype=dtype) for _ in range(layers)]
        self.values = [mx.zeros(per_layer, dtype=dtype) for _ in range(layers)]
        mx.eval(self.keys, self.values)  # allocated now: its bytes are held, not a transient of the first step
        self.max_len = shape[3]
        self.length = 0

    def positions(self, start: int | None, count: int) -> Positions:
        if start + count > self.max_len:
            raise ValueError(f"KV cache full: position {start + count} past its {self.max_len} slots")
        self.length = start + count
        return Positions(start, mx.arange(start, start + count, dtype=mx.int32), None)

    def update(self, layer: int, pos: Positions, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write k, v (B, Hkv, T, D) at the step's positions; return this layer's filled prefix."""
        end = pos.start + k.shape[2]
        self.keys[layer][:, :, pos.start:end] = k
        self.values[layer][:, :, pos.start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def trim(self, length: int) -> None:
        """Forget every position from `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot trim a cache of length {self.length} to {length}")
        self.length = length

    @property
    def state(self) -> list[list[mx.array]]:
        """What a compiled step reads and rewrites."""
        return [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values))


class StaticKVCache(KVCache):
    """Fixed shapes for `mx.compile`: while `window` is set, write at `position` (an int32 array (1,) set before
    each call) and attend over the first `window` slots, masking those past the current position.
    With `window` None it behaves like KVCache (eager prefill on the same buffers)."""

    WINDOWED = True

    def __init__(self, shape: tuple[int, int, int, int, int], dtype: mx.Dtype) -> None:
        super().__init__(shape, dtype)
        self.position = mx.zeros((1,), dtype=mx.int32)
        self.window: int | None = None

    def positions(self, start: int | None, count: int) -> Positions:
        if self.window is None:
            return super().positions(start, count)
        # `start` is ignored on purpose: under compile it would be frozen into the trace.
        ids = self.position + mx.arange(count, dtype=mx.int32)  # (T,)
        mask = mx.arange(self.window, dtype=mx.int32)[None, :] <= ids[:, None]  # (T, window)
        return Positions(None, ids, mask)

    def update(self, layer: int, pos: Positions, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        if self.window is None:
            return super().update(layer, pos, k, v)
        self.keys[layer] = mx.slice_update(self.keys[layer], k, self.position, axes=(2,))
        self.values[layer] = mx.slice_update(self.values[layer], v, self.position, axes=(2,))
        return self.keys[layer][:, :, : self.window], self.values[layer][:, :, : self.window]
