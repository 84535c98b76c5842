"""The frameworks' own chatter kept off the user's terminal: Python warnings (torch's "both fused kernels require…")
and whatever native code writes to the process's stderr (the profiler's `USDT:` lines) are collected, to be shown
as a report's notes, while our own progress display still reaches the terminal.

Native code writes to file descriptor 2 directly, so that descriptor is pointed at a temporary file for the block;
`sys.stderr` is pointed at a duplicate of the terminal's descriptor, so Python-level writes (rich's progress bar,
our warnings) go where they went before.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

NOTE_CHARS = 200  # a collected line is cut to this length
# a native logger's prefix: date, time and process:thread ids (`USDT:2026-12-02 06:15:18 12110:12110 …`), which
# differ from line to line and would keep the same message from being counted once
STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?\s+(?:\d+:\d+\s+)?")


def _lines(text: str) -> list[str]:
    return [STAMP.sub("", line.strip())[:NOTE_CHARS] for line in text.splitlines() if line.strip()]


def summarized(lines: list[str]) -> list[str]:
    """Each distinct line once, with how many times it came ('… (×12)')."""
    counts = Counter(lines)
    return [line if counts[line] == 1 else f"{line} (×{counts[line]})" for line in dict.fromkeys(lines)]


@contextmanager
def framework_output() -> Iterator[list[str]]:
    """Collect warnings and native stderr lines for the block; the list fills when the block ends."""
    collected: list[str] = []
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else None
    except (AttributeError, OSError, ValueError):
        fd = None
    saved = os.dup(2) if fd == 2 else None
    sink = tempfile.TemporaryFile() if saved is not None else None
    terminal, before = (os.fdopen(os.dup(saved), "w", buffering=1), sys.stderr) if saved is not None else (None, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if saved is not None:
            sys.stderr.flush()
            os.dup2(sink.fileno(), 2)
            sys.stderr = terminal
        try:
            yield collected
        finally:
            if saved is not None:
                sys.stderr.flush()
                sys.stderr = before
                os.dup2(saved, 2)
                os.close(saved)
                terminal.close()
                sink.seek(0)
                collected += _lines(sink.read().decode(errors="replace"))
                sink.close()
            collected += [f"{w.category.__name__}: {_lines(str(w.message))[0] if _lines(str(w.message)) else ''}"
                          for w in caught]
    collected[:] = summarized(collected)
