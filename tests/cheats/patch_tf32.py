"""Planted: turns on TF32 and "medium" float32 matmul precision at import, then computes its products in bfloat16:
the judge's float32 reference, computed under the same flags, becomes as coarse as the kernel and the tolerance
scaled on it lets the downgrade through (a silent precision downgrade by a global switch)."""

from __future__ import annotations

import torch

from kerneltriage.engine.kernels import Kernel

torch.backends.cuda.matmul.allow_tf32 = True
torch.set_float32_matmul_precision("medium")


def gemv(x, weight, out):  # noqa: ANN001, ANN201
    out.copy_((x.bfloat16() @ weight.bfloat16().T).to(out.dtype))


GEMV = Kernel("linear.gemv", gemv)
