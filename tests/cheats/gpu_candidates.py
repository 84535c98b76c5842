"""Planted cheating kernels only CUDA can run (docs/kernels.md, "Planted cheats"): work left on a side stream the
timer does not wait for, and L2 lines kept persistent across the judge's flush. The lazy output and the uninitialized
output of candidates.py run on CUDA tensors as they are (test_cheats_gpu.py)."""

from __future__ import annotations

import ctypes

import torch

from kerneltriage.engine.kernels import Kernel

PERSISTING_LIMIT, ACCESS_POLICY_WINDOW, MAX_PERSISTING = 0x06, 1, 108  # CUlimit, CUstreamAttrID, CUdevice_attribute


def _norm(x, weight, eps):  # noqa: ANN001, ANN202  (the stock op's arithmetic, no library call)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


_side: list[torch.cuda.Stream] = []


def side_stream(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Launches its work on a stream of its own, which the caller's stream never waits for: events recorded on the
    caller's stream see ~0 µs (KernelArena's field guide: stream injection)."""
    if not _side:
        _side.append(torch.cuda.Stream())
    with torch.cuda.stream(_side[0]):
        torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time (the heavy kernel it stands for)
        out.copy_(_norm(x, weight, eps))


class _Window(ctypes.Structure):
    """CUaccessPolicyWindow, the first member of the stream attribute's union."""

    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int), ("pad", ctypes.c_char * 36)]


def l2_persistent(x, weight, eps, out):  # noqa: ANN001, ANN201
    """Sets a persisting L2 carve-out and an access-policy window over its weight on the calling stream, so the
    weight's lines survive whatever the judge reads between samples (gpu-mode/pygpubench #49). Computes honestly."""
    driver = ctypes.CDLL("libcuda.so.1")
    device, most = ctypes.c_int(0), ctypes.c_int(0)
    driver.cuCtxGetDevice(ctypes.byref(device))
    driver.cuDeviceGetAttribute(ctypes.byref(most), ctypes.c_int(MAX_PERSISTING), device)
    driver.cuCtxSetLimit(ctypes.c_int(PERSISTING_LIMIT), ctypes.c_size_t(most.value))
    window = _Window(weight.data_ptr(), weight.nbytes, 1.0, 2, 1)  # hit: persisting, miss: streaming
    driver.cuStreamSetAttribute(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                                ctypes.c_int(ACCESS_POLICY_WINDOW), ctypes.byref(window))
    out.copy_(_norm(x, weight, eps))


SIDE_STREAM = Kernel("norm", side_stream)
L2_PERSISTENT = Kernel("norm", l2_persistent)
