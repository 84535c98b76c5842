"""The converted-model cache (`cache_dir()/converted/<key>/`): what each entry belongs to, listing, pruning.

An entry is keyed by its source file's path, size and mtime, so an edited or deleted source leaves its entry
behind for good. Each entry therefore records its source (`source.json`, written once the model has loaded),
and `prune` removes the entries whose source is gone or changed, and those with no record (a load that
failed, or a version of kerneltriage that kept none).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from kerneltriage.engine.paths import cache_dir

SOURCE_RECORD = "source.json"
LIVE, STALE, UNKNOWN = "live", "stale", "unknown"


@dataclass(frozen=True)
class ConvertedEntry:
    """One folder of the cache: its source (None when unrecorded), bytes on disk, and whether it is live."""

    path: Path
    source: str | None
    size_bytes: int
    status: str  # LIVE | STALE | UNKNOWN


def converted_root() -> Path:
    return cache_dir() / "converted"


def record_source(folder: Path, source: Path) -> None:
    """Note which file `folder` was converted from (after a successful load; a cache that cannot be written
    is skipped, as the cache only saves time)."""
    stat = source.stat()
    record = {"path": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        if folder.is_dir():
            (folder / SOURCE_RECORD).write_text(json.dumps(record), encoding="utf-8")
    except OSError:
        return


def _status(record: dict | None) -> str:
    if record is None:
        return UNKNOWN
    source = Path(record.get("path", ""))
    try:
        stat = source.stat()
    except OSError:
        return STALE
    same = (stat.st_size, stat.st_mtime_ns) == (record.get("size"), record.get("mtime_ns"))
    return LIVE if same else STALE


def _read_record(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / SOURCE_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def list_converted() -> list[ConvertedEntry]:
    """Every entry of the converted cache, largest first."""
    root = converted_root()
    entries = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir():
            continue
        record = _read_record(folder)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        entries.append(ConvertedEntry(folder, record.get("path") if record else None, size, _status(record)))
    return sorted(entries, key=lambda e: -e.size_bytes)


def prune_converted(everything: bool = False) -> list[ConvertedEntry]:
    """Remove stale and unrecorded entries (every entry with `everything`); returns what was removed."""
    removed = [e for e in list_converted() if everything or e.status != LIVE]
    for entry in removed:
        shutil.rmtree(entry.path, ignore_errors=True)
    return removed
