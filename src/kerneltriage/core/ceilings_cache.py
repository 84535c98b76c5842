"""The ceilings cache: one JSON file of measured device ceilings, keyed by what they are valid for (the device,
the framework build, the dtype). Every backend measures its own and stores them here; only measured values are
ever stored (a datasheet fallback is not)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from kerneltriage.core.roofline import Ceilings

CACHE_FILE = "ceilings.json"


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


def lookup(path: Path, key: str) -> Ceilings | None:
    """The cached ceilings under `key`, or None (absent or malformed)."""
    entry = _read(path).get(key, {})
    try:
        return Ceilings(float(entry["bandwidth"]), float(entry["matmul_flops"]), str(entry["source"]),
                        str(entry.get("device", "")), str(entry.get("dtype", "")))
    except (KeyError, TypeError, ValueError):
        return None


def store(path: Path, key: str, ceilings: Ceilings) -> None:
    """Add (or replace) the entry for `key`, stamped with the time it was measured."""
    data = _read(path)
    data[key] = asdict(ceilings) | {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _write(path, data)
