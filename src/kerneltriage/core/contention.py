"""Was the machine shared during a measurement? Load readings at one instant, and the judgement over an interval.

The load average counts our own threads too (torch runs one per core), so it cannot tell a busy machine from
a busy benchmark: it is recorded, not judged. What is judged is the CPU time the *rest* of the machine used
between two snapshots — all CPUs' busy time (/proc/stat) minus this process's own (`os.times`) — and, on CUDA,
other processes holding the GPU (NVML). Standard library only; a reading this machine cannot give is None.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

# Other processes used at least half a core on average while we measured: on the 2-core CI machine one
# busy-loop beside a run made prefill 27x slower; background daemons stay near 0.05.
CONTENDED_OTHER_CORES = 0.5
# /proc/stat counts in clock ticks (10 ms): over a shorter interval the share is too coarse to judge.
MIN_INTERVAL_S = 0.2
_PROC_STAT = Path("/proc/stat")
# /proc/stat's aggregate "cpu" line: user nice system idle iowait irq softirq steal (guest is inside user).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def _cpu_busy_seconds() -> float | None:
    """CPU seconds every CPU of the machine has spent busy since boot (summed over CPUs)."""
    try:
        first = _PROC_STAT.read_text().splitlines()[0].split()
        ticks = [int(v) for v in first[1:]]
        return sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _self_cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of the children it has waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_count() -> int | None:
    """CPUs this process may run on (a container's affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def cpu_readings() -> dict[str, Any]:
    """The CPU side of a Snapshot: load average, CPUs, cumulative busy seconds of the machine and of us."""
    return {"load_avg_1m": _load_average(), "cpu_count": cpu_count(), "cpu_busy_s": _cpu_busy_seconds(),
            "self_cpu_s": _self_cpu_seconds()}


def gpu_readings(nvml: ModuleType, handle: Any) -> dict[str, Any]:
    """The GPU side: utilization (%) and how many processes other than this one hold a context on it.

    In a PID namespace (a container) NVML reports host PIDs, so our own context shows under a PID we cannot
    match: when ours is not among them, one of the listed processes is taken to be ours.
    """
    pids: set[int] = set()
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            pids |= {int(p.pid) for p in getattr(nvml, query)(handle)}
        except (nvml.NVMLError, AttributeError):
            continue
    try:
        utilization = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        utilization = None
    others = len(pids - {os.getpid()}) if os.getpid() in pids else max(0, len(pids) - 1)
    return {"gpu_utilization_pct": utilization, "gpu_other_processes": others}


class Snapshot(Protocol):
    """The readings of a snapshot the judgement uses (environment.Snapshot records them, frozen; None: not
    measurable)."""

    @property
    def time(self) -> float: ...
    @property
    def load_avg_1m(self) -> float | None: ...
    @property
    def cpu_count(self) -> int | None: ...
    @property
    def cpu_busy_s(self) -> float | None: ...
    @property
    def self_cpu_s(self) -> float | None: ...
    @property
    def gpu_other_processes(self) -> int | None: ...


def other_cores(start: Snapshot, end: Snapshot) -> float | None:
    """Cores' worth of CPU the rest of the machine used on average between the two snapshots; None when
    either snapshot lacks the readings (an older ledger row, a non-Linux machine) or the interval is too short."""
    wall = end.time - start.time
    busy0, busy1, ours0, ours1 = start.cpu_busy_s, end.cpu_busy_s, start.self_cpu_s, end.self_cpu_s
    if wall < MIN_INTERVAL_S or busy0 is None or busy1 is None or ours0 is None or ours1 is None:
        return None
    others = (busy1 - busy0) - (ours1 - ours0)
    return max(0.0, others / wall)


def contention(start: Snapshot | None, end: Snapshot | None) -> str | None:
    """One line saying why the machine was shared between `start` and `end`, or None when it was quiet
    (or when the snapshots cannot tell: missing readings are not evidence of contention)."""
    if start is None or end is None:
        return None
    reasons = []
    others = other_cores(start, end)
    if others is not None and others >= CONTENDED_OTHER_CORES:
        cores = f" of {end.cpu_count}" if end.cpu_count else ""
        load = f", load average {end.load_avg_1m:.2f}" if end.load_avg_1m is not None else ""
        reasons.append(f"other processes used {others:.2f}{cores} CPU cores during the run{load}")
    gpu_others = max(s.gpu_other_processes or 0 for s in (start, end))
    if gpu_others:
        reasons.append(f"{gpu_others} other process(es) held the GPU")
    return "; ".join(reasons) or None
