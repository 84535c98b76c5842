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


def shown(path: str | Path) -> str:
    """A path as a report records it: under the user's home written `~/…`, so a result file names the user cache
    folder, not the recording machine's home (a path elsewhere, or a preset's name, is kept as given)."""
    home, text = str(Path.home()), str(path)
    return "~" + text[len(home):] if home not in ("", "/") and (text == home or text.startswith(home + "/")) else text


def converted_dir(source: Path) -> Path:
    """Folder for the converted form of one model file, keyed by its path, size and mtime."""
    stat = source.stat()
    key = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTED_VERSION}"
    return cache_dir() / "converted" / hashlib.sha1(key.encode()).hexdigest()[:16]
