"""How device ceilings are measured, whatever framework runs the probes: the sizes of one device kind's probes, the
median of synchronized samples after warm-ups, and the arithmetic that turns seconds into bytes/s and FLOP/s.
Each backend runs the ops (a copy, a square matmul) with its own arrays and clock (backends/*/ceilings.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from kerneltriage.core.environment import cpu_model

WARMUPS = 2


@dataclass(frozen=True)
class Probe:
    """Sizes for one device kind: copy buffer bytes, matmul side, operations per sample, samples."""

    copy_bytes: int
    matmul_side: int
    ops_per_sample: int
    samples: int


def median_seconds(op: Callable[[], object], clock: Callable[[], float], probe: Probe) -> float:
    """Median seconds per op over `probe.samples` samples of `probe.ops_per_sample` ops each, after WARMUPS ops;
    `clock` waits for the device's queued work before it reads the time."""
    for _ in range(WARMUPS):
        op()
    samples = []
    for _ in range(probe.samples):
        start = clock()
        for _ in range(probe.ops_per_sample):
            op()
        samples.append((clock() - start) / probe.ops_per_sample)
    return statistics.median(samples)


def copy_bandwidth(probe: Probe, seconds: float) -> float:
    """Bytes per second of one pass over the copy buffer: its bytes read plus as many written."""
    return 2 * probe.copy_bytes / seconds


def matmul_flops(probe: Probe, seconds: float) -> float:
    """FLOP/s of one square matmul of the probe's side n: 2·n³ FLOPs."""
    return 2 * probe.matmul_side**3 / seconds


def cpu_name() -> str:
    """The CPU as a ceiling's device: 'cpu <model>'."""
    return f"cpu {cpu_model() or 'unknown'}"
