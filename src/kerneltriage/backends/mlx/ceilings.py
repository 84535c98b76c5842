"""Device ceilings on MLX, measured with MLX itself: copy bandwidth and matmul peak, cached per device + MLX
version + dtype (in the same file as torch's, under keys that say "mlx").

Copy bandwidth: an elementwise pass (x + 0) over a buffer far larger than any cache, counting bytes read plus
bytes written: what MLX moves per second on this device. On the CPU, numpy's copy of such a buffer instead: MLX's CPU
elementwise ops are not a memory probe (2.5 GB/s on a 2-core EPYC that copies at 20+, so MLX's own decode, reading
its weights through BLAS, read at 131% of that "roofline"). Matmul peak: square matmuls of random data in the run
dtype (4096³ on a GPU, 512³ on the CPU). Each is the median of several synchronized samples after a warm-up,
every result evaluated (MLX is lazy: an unevaluated result is no work at all). There is no datasheet fallback:
a measurement that fails is reported as failed.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from kerneltriage.backends.mlx.device import device_type
from kerneltriage.backends.mlx.timing import synced_clock
from kerneltriage.core import ceilings_cache
from kerneltriage.core.ceilings_cache import CACHE_FILE
from kerneltriage.core.ceilings_probe import Probe, copy_bandwidth, cpu_name, matmul_flops, median_seconds
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.paths import cache_dir


# The CPU matmul is 512³: the Linux `mlx[cpu]` wheel links the reference BLAS (netlib, ~4 GFLOP/s on 2 cores),
# where 1024³ would take 6 s for the same answer.
PROBES = {"gpu": Probe(1 << 30, 4096, 10, 10), "cpu": Probe(64 << 20, 512, 2, 5)}


def device_name(device: str) -> str:
    """The GPU's name as MLX reports it, or 'cpu <model>'."""
    if device == "cpu":
        return cpu_name()
    info = mx.device_info()
    return str(info.get("device_name") or info.get("architecture") or device_type(device))


def cache_key(device: str, dtype: str) -> str:
    """What a cached ceiling is valid for: the device, the MLX build and the dtype."""
    copy = " | copy numpy" if device == "cpu" else ""  # (earlier CPU entries measured MLX's elementwise pass)
    return f"{device_name(device)} | mlx {mx.__version__} {device_type(device)}{copy} | {dtype}"


def measure_copy_bandwidth(probe: Probe, device: str) -> float:
    """Bytes read + written per second by an elementwise pass over random float32 data (the CPU: numpy's copy)."""
    if device == "cpu":
        data = np.random.default_rng(0).random(probe.copy_bytes // 8)
        out = np.empty_like(data)
        return copy_bandwidth(probe, median_seconds(lambda: np.copyto(out, data), time.perf_counter, probe))
    src = mx.random.uniform(shape=(probe.copy_bytes // 4,))
    mx.eval(src)
    return copy_bandwidth(probe, median_seconds(lambda: mx.eval(src + 0.0), synced_clock, probe))


def measure_matmul_peak(dtype: mx.Dtype, probe: Probe) -> float:
    """FLOP/s of a square matmul of random data in `dtype` (2·n³ FLOPs)."""
    n = probe.matmul_side
    a, b = (mx.random.normal((n, n)).astype(dtype) for _ in range(2))
    mx.eval(a, b)
    return matmul_flops(probe, median_seconds(lambda: mx.eval(a @ b), synced_clock, probe))


def measure(device: str, dtype: str) -> Ceilings:
    """Measure both ceilings now on `device` (the CPU: under 3 s)."""
    probe = PROBES["cpu" if device == "cpu" else "gpu"]
    with mx.stream(mx.cpu if device == "cpu" else mx.gpu):
        bandwidth = measure_copy_bandwidth(probe, device)
        flops = measure_matmul_peak(getattr(mx, dtype), probe)
    mx.clear_cache()
    return Ceilings(bandwidth, flops, "measured", device_name(device), dtype)


def get_ceilings(device: str, dtype: str, refresh: bool = False, path: Path | None = None) -> Ceilings:
    """Cached ceilings for (device, MLX version, dtype), measured on a miss, when `refresh`, or when the cached ones
    were measured on a shared machine and the machine is quiet now."""
    return ceilings_cache.cached(path or cache_dir() / CACHE_FILE, cache_key(device, dtype),
                                 lambda: measure(device, dtype), refresh)
