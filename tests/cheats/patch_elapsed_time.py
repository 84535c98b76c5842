"""Planted: rebinds `torch.cuda.Event.elapsed_time` at import to report a hundredth of the time whenever the kernel
ran between the two events (GPU MODE reference-kernels #162)."""

from __future__ import annotations

import torch

from kerneltriage.engine.kernels import Kernel


def _norm(x, weight, eps):  # noqa: ANN001, ANN202  (the stock op's arithmetic, no library call)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

_real = torch.cuda.Event.elapsed_time
_ran = [False]


def _elapsed(self, end):  # noqa: ANN001, ANN202
    ms = _real(self, end)
    scaled, _ran[0] = (ms / 100 if _ran[0] else ms), False
    return scaled


torch.cuda.Event.elapsed_time = _elapsed


def norm(x, weight, eps, out):  # noqa: ANN001, ANN201
    _ran[0] = True
    out.copy_(_norm(x, weight, eps))


NORM = Kernel("norm", norm)
