"""Device ceilings, measured: copy bandwidth and matmul peak, cached per device + torch version + dtype.

Copy bandwidth: a device-to-device copy of a buffer far larger than any cache, counting bytes read plus
bytes written. Matmul peak: square matmuls of random data in the run dtype (bf16 8192³ on CUDA, float32
1024³ on CPU). Each is the median of several synchronized samples after a warm-up. Datasheet numbers
are used only when measuring fails, and are labelled `source: "datasheet"` (and never cached).

Ceilings measured while other processes shared the machine are too low, and every later run's % of roofline
too high. So each cached entry carries the load it was measured under (`core.contention`), an entry measured
on a shared machine (or one that predates this record) is measured again once a run finds the machine quiet
(`core.ceilings_cache`); a rate above 100% of the roofline — impossible — makes bench and triage measure them
again.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.core import ceilings_cache
from kerneltriage.core.ceilings_cache import CACHE_FILE
from kerneltriage.core.ceilings_probe import Probe, copy_bandwidth, cpu_name, matmul_flops, median_seconds
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.paths import cache_dir


# CUDA: 1 GiB buffer (≫ 50 MB L2), 8192³ bf16 (~1.1 TFLOP); CPU: 64 MiB (≫ L3), 1024³ float32 — < 3 s total.
PROBES = {"cuda": Probe(1 << 30, 8192, 10, 10), "cpu": Probe(64 << 20, 1024, 2, 5)}
# Vendor datasheet peaks (dense, no sparsity), matched by a substring of the device name.
DATASHEET = {"H200": {"bandwidth": 4.8e12, "bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
             "H100": {"bandwidth": 3.35e12, "bfloat16": 989e12, "float16": 989e12, "float32": 67e12}}


def device_name(device: torch.device) -> str:
    """The GPU's name, or 'cpu <model>'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cache_key(device: torch.device, dtype: torch.dtype) -> str:
    """What a cached ceiling is valid for: the device, the torch build (it names its CUDA) and the dtype."""
    return f"{device_name(device)} | torch {torch.__version__} | {dtype_name(dtype)}"


def measure_copy_bandwidth(device: torch.device, probe: Probe) -> float:
    """Bytes read + written per second by a device-to-device copy of random data."""
    count = probe.copy_bytes // 4
    src = torch.rand(count, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    return copy_bandwidth(probe, median_seconds(lambda: dst.copy_(src), lambda: synced_clock(device), probe))


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, probe: Probe) -> float:
    """FLOP/s of a square matmul of random data in `dtype` (2·n³ FLOPs)."""
    n = probe.matmul_side
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return matmul_flops(probe, median_seconds(lambda: torch.matmul(a, b, out=out), lambda: synced_clock(device), probe))


def measure(device: torch.device, dtype: torch.dtype) -> Ceilings:
    """Measure both ceilings now (CUDA: a few seconds; CPU: under 3 s)."""
    probe = PROBES["cuda" if device.type == "cuda" else "cpu"]
    with torch.inference_mode():
        bandwidth = measure_copy_bandwidth(device, probe)
        flops = measure_matmul_peak(device, dtype, probe)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Ceilings(bandwidth, flops, "measured", device_name(device), dtype_name(dtype))


def datasheet(device: torch.device, dtype: torch.dtype) -> Ceilings | None:
    """The vendor's numbers for this device, if known."""
    name = device_name(device)
    for model, values in DATASHEET.items():
        if model in name and dtype_name(dtype) in values:
            return Ceilings(values["bandwidth"], values[dtype_name(dtype)], "datasheet", name, dtype_name(dtype))
    return None


def get_ceilings(device: torch.device, dtype: torch.dtype, refresh: bool = False,
                 path: Path | None = None) -> Ceilings:
    """Cached ceilings for (device, torch version, dtype), measured on a miss, when `refresh`, or when the cached
    ones were measured on a shared machine (or without a load record) and the machine is quiet now.

    When measuring fails (e.g. the GPU is out of memory) the datasheet values are returned, labelled so;
    a device without datasheet values re-raises the failure.
    """
    path = path or cache_dir() / CACHE_FILE
    try:
        return ceilings_cache.cached(path, cache_key(device, dtype), lambda: measure(device, dtype), refresh,
                                     device.index or 0)
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        fallback = datasheet(device, dtype)
        if fallback is None:
            raise
        return fallback


def cached_entry(device: torch.device, dtype: torch.dtype, path: Path | None = None) -> dict:
    """The cache's record for this device and dtype (values, when, under what load); {} when absent."""
    return ceilings_cache.entry(path or cache_dir() / CACHE_FILE, cache_key(device, dtype))
