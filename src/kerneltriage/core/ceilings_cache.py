"""The ceilings cache: one JSON file of measured device ceilings, keyed by what they are valid for (the device,
the framework build, the dtype). Every backend measures its own and stores them here; only measured values are
ever stored (a datasheet fallback is not).

Ceilings measured while other processes shared the machine are too low, and every later run's % of roofline
too high. So each entry carries the load it was measured under (`core.contention`), and an entry measured on a
shared machine (or one that predates this record) is measured again once a run finds the machine quiet.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kerneltriage.core.contention import contention, other_cores
from kerneltriage.core.environment import take_snapshot
from kerneltriage.core.roofline import Ceilings

CACHE_FILE = "ceilings.json"
# How long the machine is watched, idle, to tell whether it is quieter than when cached ceilings were measured.
PROBE_S = 0.5


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent, unreadable or corrupt: measure again and overwrite
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    """Atomically: a concurrent reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ceilings-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def entry(path: Path, key: str) -> dict:
    """The cache's record under `key` (values, when, under what load); {} when absent."""
    found = _read(path).get(key, {})
    return found if isinstance(found, dict) else {}


def _ceilings(record: dict) -> Ceilings | None:
    try:
        return Ceilings(float(record["bandwidth"]), float(record["matmul_flops"]), str(record["source"]),
                        str(record.get("device", "")), str(record.get("dtype", "")))
    except (KeyError, TypeError, ValueError):
        return None


def worth_remeasuring(record: dict, gpu_index: int = 0) -> bool:
    """The record was measured on a shared machine, or records no load, and the machine is quiet now."""
    if not record or ("contended" in record and record["contended"] is None):
        return False
    start = take_snapshot(gpu_index)
    time.sleep(PROBE_S)  # idle: whatever runs now is other processes
    return contention(start, take_snapshot(gpu_index)) is None


def cached(path: Path, key: str, measure: Callable[[], Ceilings], refresh: bool = False,
           gpu_index: int = 0) -> Ceilings:
    """The ceilings under `key`, measured (and stored with the load they were measured under) on a miss, when
    `refresh`, or when the cached ones were taken on a shared machine and the machine is quiet now."""
    record = entry(path, key)
    found = None if refresh or worth_remeasuring(record, gpu_index) else _ceilings(record)
    if found is not None:
        return found
    start = take_snapshot(gpu_index)
    ceilings = measure()
    end = take_snapshot(gpu_index)
    load = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "other_cores": other_cores(start, end), "load_avg_1m": end.load_avg_1m,
            "contended": contention(start, end)}
    data = _read(path)
    data[key] = asdict(ceilings) | load
    try:
        _write(path, data)
    except OSError:
        pass  # an unwritable cache only means measuring again next time
    return ceilings
