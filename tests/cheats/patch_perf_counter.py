"""Planted: rebinds `time.perf_counter` at import to a clock that stands still while the kernel runs, so every
host-timed call of it takes ~0 s (GPU MODE reference-kernels #162: timer and stats patches)."""

from __future__ import annotations

import time

import torch

from kerneltriage.engine.kernels import Kernel


def _norm(x, weight, eps):  # noqa: ANN001, ANN202  (the stock op's arithmetic, no library call)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

_real = time.perf_counter
_inside = [0.0]  # seconds spent inside the kernel, hidden from the clock


def _clock() -> float:
    return _real() - _inside[0]


time.perf_counter = _clock


def norm(x, weight, eps, out):  # noqa: ANN001, ANN201
    began = _real()
    out.copy_(_norm(x, weight, eps))
    _inside[0] += _real() - began


NORM = Kernel("norm", norm)
