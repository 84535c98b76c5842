"""Host clocks that wait for MLX first: MLX is lazy and asynchronous, so work is counted where it ran only after
`mx.synchronize()` (every stream of the default device finished)."""

from __future__ import annotations

import resource
import sys
import time

import mlx.core as mx


def synchronize() -> None:
    mx.synchronize()


def synced_clock() -> float:
    """perf_counter after all queued MLX work has finished."""
    mx.synchronize()
    return time.perf_counter()


def peak_memory_bytes(device_type: str) -> int:
    """Peak bytes MLX's allocator held since the last reset on a GPU (Metal, CUDA); on the CPU the process's peak
    resident set, as the torch backend reports it (the bench's engines share one process)."""
    if device_type != "cpu":
        return int(mx.get_peak_memory())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports kB


def reset_peak_memory() -> None:
    mx.reset_peak_memory()
