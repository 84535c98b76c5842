"""Planted: rebinds `torch.cuda.synchronize` at import to a no-op, so a host clock read "after the device finished"
is read while the kernel's work is still queued (KernelArena's field guide: timing attacks)."""

from __future__ import annotations

import torch

from kerneltriage.engine.kernels import Kernel


def _norm(x, weight, eps):  # noqa: ANN001, ANN202  (the stock op's arithmetic, no library call)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

torch.cuda.synchronize = lambda device=None: None


def norm(x, weight, eps, out):  # noqa: ANN001, ANN201
    out.copy_(_norm(x, weight, eps))


NORM = Kernel("norm", norm)
