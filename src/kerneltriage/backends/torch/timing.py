"""Host clocks that wait for the device first, so asynchronous work is counted where it ran."""

from __future__ import annotations

import resource
import sys
import time

import torch

from kerneltriage.core import integrity

# What a torch measurement relies on: the clocks and synchronizations it calls, and the flags that set how float32
# is computed (a candidate turning TF32 on makes the float32 reference as coarse as itself). Sealed at import.
SEALED = ("torch.cuda.synchronize", "torch.cuda.current_stream", "torch.cuda.Event.record",
          "torch.cuda.Event.synchronize", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.query",
          "torch.cuda.Stream.synchronize", "torch.cuda.Stream.wait_stream", "torch.cuda.CUDAGraph.replay",
          "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
          "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
          "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
          "torch.get_float32_matmul_precision()", "torch.get_default_dtype()")
integrity.watch(SEALED)


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
