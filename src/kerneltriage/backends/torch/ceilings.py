"""Device ceilings, measured: copy bandwidth and matmul peak, cached per device + torch version + dtype.

Copy bandwidth: a device-to-device copy of a buffer far larger than any cache, counting bytes read plus
bytes written. Matmul peak: square matmuls of random data in the run dtype (bf16 8192³ on CUDA, float32
1024³ on CPU). Each is the median of several synchronized samples after a warm-up. Datasheet numbers
are used only when measuring fails, and are labelled `source: "datasheet"` (and never cached).

Ceilings measured while other processes shared the machine are too low, and every later run's % of roofline
too high. So each cached entry carries the load it was measured under (`core.contention`), an entry measured
on a shared machine (or one that predates this record) is measured again once a run finds the machine quiet,
and a rate above 100% of the roofline — impossible — re-measures them (`check_rate`).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.core.contention import contention, other_cores
from kerneltriage.core.environment import cpu_model, take_snapshot
from kerneltriage.core.units import format_bandwidth, format_flops
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine.paths import cache_dir


@dataclass(frozen=True)
class Probe:
    """Sizes for one device type: copy buffer bytes, matmul side, operations per sample, samples."""

    copy_bytes: int
    matmul_side: int
    ops_per_sample: int
    samples: int


# CUDA: 1 GiB buffer (≫ 50 MB L2), 8192³ bf16 (~1.1 TFLOP); CPU: 64 MiB (≫ L3), 1024³ float32 — < 3 s total.
PROBES = {"cuda": Probe(1 << 30, 8192, 10, 10), "cpu": Probe(64 << 20, 1024, 2, 5)}
WARMUPS = 2
CACHE_FILE = "ceilings.json"
# How long the machine is watched, idle, to tell whether it is quieter than when cached ceilings were measured.
PROBE_S = 0.5
# A measured rate this far past the roofline cannot be: the ceilings under it are wrong.
IMPOSSIBLE_FRACTION = 1.0
# Vendor datasheet peaks (dense, no sparsity), matched by a substring of the device name.
DATASHEET = {"H200": {"bandwidth": 4.8e12, "bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
             "H100": {"bandwidth": 3.35e12, "bfloat16": 989e12, "float16": 989e12, "float32": 67e12}}


def device_name(device: torch.device) -> str:
    """The GPU's name, or 'cpu <model>'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {cpu_model() or 'unknown'}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cache_key(device: torch.device, dtype: torch.dtype) -> str:
    """What a cached ceiling is valid for: the device, the torch build (it names its CUDA) and the dtype."""
    return f"{device_name(device)} | torch {torch.__version__} | {dtype_name(dtype)}"


def _median_seconds(op: Callable[[], object], device: torch.device, probe: Probe) -> float:
    """Median seconds per op over `probe.samples` samples of `probe.ops_per_sample` ops each."""
    for _ in range(WARMUPS):
        op()
    samples = []
    for _ in range(probe.samples):
        start = synced_clock(device)
        for _ in range(probe.ops_per_sample):
            op()
        samples.append((synced_clock(device) - start) / probe.ops_per_sample)
    return statistics.median(samples)


def measure_copy_bandwidth(device: torch.device, probe: Probe) -> float:
    """Bytes read + written per second by a device-to-device copy of random data."""
    count = probe.copy_bytes // 4
    src = torch.rand(count, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, probe)
    return 2 * probe.copy_bytes / seconds


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, probe: Probe) -> float:
    """FLOP/s of a square matmul of random data in `dtype` (2·n³ FLOPs)."""
    n = probe.matmul_side
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _median_seconds(lambda: torch.matmul(a, b, out=out), device, probe)
    return 2 * n**3 / seconds


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


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # unreadable or corrupt: measure again and overwrite
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: dict) -> None:
    """Atomically: a concurrent reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ceilings-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _from_entry(entry: dict) -> Ceilings | None:
    try:
        return Ceilings(float(entry["bandwidth"]), float(entry["matmul_flops"]), str(entry["source"]),
                        str(entry.get("device", "")), str(entry.get("dtype", "")))
    except (KeyError, TypeError, ValueError):
        return None


def get_ceilings(device: torch.device, dtype: torch.dtype, refresh: bool = False,
                 path: Path | None = None) -> Ceilings:
    """Cached ceilings for (device, torch version, dtype), measured on a miss, when `refresh`, or when the cached
    ones were measured on a shared machine (or without a load record) and the machine is quiet now.

    When measuring fails (e.g. the GPU is out of memory) the datasheet values are returned, labelled so;
    a device without datasheet values re-raises the failure.
    """
    path = path or cache_dir() / CACHE_FILE
    entry = _read_cache(path).get(cache_key(device, dtype), {})
    cached = None if refresh or _worth_remeasuring(entry, device) else _from_entry(entry)
    if cached is not None:
        return cached
    try:
        ceilings, load = _measure_with_load(device, dtype)
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        fallback = datasheet(device, dtype)
        if fallback is None:
            raise
        return fallback
    _store(path, cache_key(device, dtype), asdict(ceilings) | load)
    return ceilings


def cached_entry(device: torch.device, dtype: torch.dtype, path: Path | None = None) -> dict:
    """The cache's record for this device and dtype (values, when, under what load); {} when absent."""
    return _read_cache(path or cache_dir() / CACHE_FILE).get(cache_key(device, dtype), {})


def check_rate(fraction: float, what: str, device: torch.device, dtype: torch.dtype,
               path: Path | None = None) -> tuple[Ceilings, str] | None:
    """None when `fraction` of the roofline is possible. Above 100% it is not: the ceilings were stale or
    measured on a busy machine. They are then measured again, and returned with a one-line note saying so
    (call it with each rate a run reports as a fraction of its roofline, and recompute with the new ceilings)."""
    if fraction <= IMPOSSIBLE_FRACTION:
        return None
    before = cached_entry(device, dtype, path)
    ceilings = get_ceilings(device, dtype, refresh=True, path=path)
    then = f" (measured {before['measured_at']}, {before.get('contended') or 'load not recorded'})" if before else ""
    note = (f"{what} at {fraction:.0%} of the roofline is impossible: the cached ceilings were stale or measured "
            f"on a busy machine{then}; measured again: copy {format_bandwidth(ceilings.bandwidth)}, matmul "
            f"{format_flops(ceilings.matmul_flops)}")
    return ceilings, note


def _measure_with_load(device: torch.device, dtype: torch.dtype) -> tuple[Ceilings, dict]:
    """Measured ceilings and the load they were measured under."""
    start = take_snapshot(device.index or 0)
    ceilings = measure(device, dtype)
    end = take_snapshot(device.index or 0)
    return ceilings, {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      "other_cores": other_cores(start, end), "load_avg_1m": end.load_avg_1m,
                      "contended": contention(start, end)}


def _worth_remeasuring(entry: dict, device: torch.device) -> bool:
    """The entry was measured on a shared machine, or records no load, and the machine is quiet now."""
    if not entry or ("contended" in entry and entry["contended"] is None):
        return False
    start = take_snapshot(device.index or 0)
    time.sleep(PROBE_S)  # idle: whatever runs now is other processes
    return contention(start, take_snapshot(device.index or 0)) is None


def _store(path: Path, key: str, entry: dict) -> None:
    """Add one entry; an unwritable cache only means measuring again next time."""
    data = _read_cache(path)
    data[key] = entry
    try:
        _write_cache(path, data)
    except OSError:
        return
