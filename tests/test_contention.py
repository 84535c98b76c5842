"""Busy-machine detection: other processes' CPU between two snapshots, GPU neighbours, older ledger rows."""

from __future__ import annotations

import subprocess
import sys
import time

from kerneltriage.core.contention import CONTENDED_OTHER_CORES, contention, other_cores
from kerneltriage.core.environment import Snapshot, take_snapshot


def snapshots(others_cores: float, wall: float = 10.0, ours: float = 15.0, **end: object) -> tuple[Snapshot, Snapshot]:
    """A start and an end `wall` seconds apart in which we used `ours` CPU seconds and others `others_cores`."""
    start = Snapshot(time=100.0, load_avg_1m=1.0, cpu_count=2, cpu_busy_s=1000.0, self_cpu_s=50.0)
    busy = 1000.0 + ours + others_cores * wall
    return start, Snapshot(time=100.0 + wall, load_avg_1m=2.5, cpu_count=2, cpu_busy_s=busy,
                           self_cpu_s=50.0 + ours, **end)


def test_a_quiet_machine_is_not_contended() -> None:
    start, end = snapshots(0.05)
    assert abs(other_cores(start, end) - 0.05) < 1e-9
    assert contention(start, end) is None


def test_another_busy_process_is_named_with_its_share() -> None:
    start, end = snapshots(1.0)
    reason = contention(start, end)
    assert reason is not None and "1.00 of 2 CPU cores" in reason and "load average 2.50" in reason


def test_the_threshold_is_the_named_constant() -> None:
    assert contention(*snapshots(CONTENDED_OTHER_CORES * 0.9)) is None
    assert contention(*snapshots(CONTENDED_OTHER_CORES * 1.1)) is not None


def test_our_own_cpu_is_not_counted_as_others() -> None:
    # We kept both cores busy (20 CPU seconds in 10 s); nobody else ran.
    assert contention(*snapshots(0.0, ours=20.0)) is None


def test_missing_readings_or_a_short_interval_cannot_tell() -> None:
    assert contention(Snapshot(time=0.0), Snapshot(time=5.0)) is None  # an older ledger row
    assert contention(None, Snapshot(time=5.0)) is None
    assert other_cores(*snapshots(2.0, wall=0.05)) is None


def test_other_gpu_processes_are_contention() -> None:
    reason = contention(*snapshots(0.0, gpu_other_processes=2))
    assert reason is not None and "2 other process(es) held the GPU" in reason


def test_older_rows_without_load_fields_still_read_and_newer_fields_are_dropped() -> None:
    old = {"time": 1.0, "on_battery": False, "sm_clock_mhz": None, "memory_clock_mhz": None,
           "temperature_c": None, "power_w": None}
    snap = Snapshot.from_dict(old)
    assert snap.cpu_busy_s is None and snap.load_avg_1m is None
    assert Snapshot.from_dict({**old, "from_the_future": 3}).time == 1.0
    fresh = take_snapshot()
    assert Snapshot.from_dict(fresh.to_dict()) == fresh


def test_a_busy_loop_beside_us_is_seen() -> None:
    """A real busy loop in another process: its CPU appears as others', ours (asleep) does not."""
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start
        start = take_snapshot()
        time.sleep(1.0)
        end = take_snapshot()
    finally:
        loop.kill()
        loop.wait()
    assert start.cpu_busy_s is not None and start.cpu_count
    assert other_cores(start, end) >= 0.8
    assert "CPU cores during the run" in contention(start, end)
