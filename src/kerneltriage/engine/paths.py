"""Where kerneltriage keeps things on the user's machine (never inside the repository)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CACHE_ENV = "KERNELTRIAGE_CACHE"
# Bump when the layout of a converted form changes, so stale caches are ignored (2: BOS added by llama.cpp's
# default for a llama-3 style BPE vocabulary that does not say).
CONVERTED_VERSION = 2


def cache_dir() -> Path:
    """`$KERNELTRIAGE_CACHE`, else `$XDG_CACHE_HOME/kerneltriage`, else `~/.cache/kerneltriage`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kerneltriage"


def converted_dir(source: Path) -> Path:
    """Folder for the converted form of one model file, keyed by its path, size and mtime."""
    stat = source.stat()
    key = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTED_VERSION}"
    return cache_dir() / "converted" / hashlib.sha1(key.encode()).hexdigest()[:16]
