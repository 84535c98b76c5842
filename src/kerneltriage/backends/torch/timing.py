"""Host clocks that wait for the device first, so asynchronous work is counted where it ran."""

from __future__ import annotations

import resource
import sys
import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synced_clock(device: torch.device) -> float:
    """perf_counter after all queued work on `device` has finished."""
    synchronize(device)
    return time.perf_counter()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory since the last reset (CUDA); on CPU the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports kB


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
