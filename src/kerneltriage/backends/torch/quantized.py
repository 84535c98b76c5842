"""The `quantized` lever on torch: each layer projection stored in the GGUF as Q4_0, Q4_1 or Q8_0 keeps its blocks on
the device (`kernels/quant_gemv.py`): decode and verify rows (≤ 16) through the quantized GEMV, prompts through the
weight dequantized for the call and a GEMM. The dequantized copies are dropped, so weight memory shrinks too.
Other tensor types (F16, K-quants, …), the embedding and the output projection stay dequantized.

It runs where Triton runs: CUDA, or the CPU under Triton's interpreter (the tests). A stock copy of a quantized
model (`load.stock_copy`: `ab`'s float32 reference) takes each projection's dequantized values.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from kerneltriage.backends.torch import counting
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError

LEVER = "quantized"
PROJECTIONS = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"), "v": ("self_attn", "v_proj"),
               "o": ("self_attn", "o_proj"), "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"),
               "down": ("mlp", "down_proj")}


class QuantLinear(nn.Module):
    """A Linear whose weight is kept as GGUF blocks (buffers: the model's bytes count them); the bias, if any, stays
    a parameter."""

    def __init__(self, runner: Runner, weight, bias: nn.Parameter | None) -> None:  # noqa: ANN001 - a QuantWeight
        super().__init__()
        self.qtype, self.bias, self.dtype = weight.qtype, bias, runner.torch_dtype
        self.out_features, self.in_features = weight.shape
        self.register_buffer("scales", weight.scales, persistent=False)
        self.register_buffer("mins", weight.mins, persistent=False)
        self.register_buffer("quants", weight.quants, persistent=False)
        self._count = lambda: counting.ran(runner, LEVER)  # a closure: the runner is not a submodule

    @property
    def quant(self):  # noqa: ANN201 - a QuantWeight
        from kerneltriage.kernels.quant_gemv import QuantWeight

        return QuantWeight(self.qtype, self.scales, self.mins, self.quants, (self.out_features, self.in_features))

    def stock_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dequantized weight (N, K) in `dtype` (default: the model's); float32 is exact, as the GEMV sums it."""
        from kerneltriage.kernels.quant_gemv import dequantized

        return dequantized(self.quant, dtype or self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._count()
        return self.product(x)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x · Wᵀ (+ bias), uncounted (the M-sweep times it without posing as the lever's proof of execution)."""
        from kerneltriage.kernels.quant_gemv import GEMV_ROWS, dequantized, quant_gemv

        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] <= GEMV_ROWS:
            y = quant_gemv(rows, self.quant)
        else:
            y = F.linear(rows, dequantized(self.quant, x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def quantized(runner: Runner, value: str | None = None) -> None:
    """delete: each layer's Q4_0/Q4_1/Q8_0 projections read as their blocks by a Triton GEMV (decode and verify)."""
    from kerneltriage.kernels.quant_gemv import KINDS, split_blocks

    if runner.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(f"--levers {LEVER}: on torch its GEMV is a Triton kernel; expected a CUDA device, not "
                         f"{runner.device}")
    tensors = runner.checkpoint.tensors
    kept = [(index, suffix) for index in range(len(runner.model.layers)) for suffix in PROJECTIONS
            if getattr(tensors.get(f"layers.{index}.{suffix}"), "qtype", None) in KINDS]
    if not kept:
        types = sorted({raw.qtype for name, raw in tensors.items() if name.startswith("layers.")})
        raise InputError(f"--levers {LEVER}: {runner.checkpoint.source} has no {', '.join(KINDS)} projection weights "
                         f"(its layers are {', '.join(types) or 'random'}); expected a GGUF quantized to one of them")
    for index, suffix in kept:
        parent_name, child = PROJECTIONS[suffix]
        parent = getattr(runner.model.layers[index], parent_name)
        linear = getattr(parent, child)
        setattr(parent, child, QuantLinear(runner, split_blocks(tensors[f"layers.{index}.{suffix}"], runner.device),
                                           linear.bias))  # the dequantized weight goes with the Linear
    runner.no_compile = LEVER
