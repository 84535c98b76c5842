"""The M-sweep: every projection matmul shape of the model (a `quantized` one through its own GEMV) at M = 1…16
rows (what speculative verification, k + 1 rows, feeds it), per-call time. A bandwidth-bound GEMV costs about the
same at every small M; a jump or a smaller M costing more than a larger one is a hole in the library's tuning grid.

CUDA: every layer's weight of a shape is cycled through (for a large model none stays cache-resident; a small
model's can all sit in L2, so its small GEMVs say little about bandwidth), the calls captured in a
CUDA graph and replayed between CUDA events (eager launches would time a slow host, not the GEMV).
CPU: tiny — one weight per shape, a few row counts, a synchronized host clock.
"""

from __future__ import annotations

import statistics

import torch

from kerneltriage.backends.torch.gates import graph_seconds
from kerneltriage.backends.torch.models.llama import Model
from kerneltriage.backends.torch.timing import synced_clock
from kerneltriage.engine.probes import SweepCurve

SWEEP_ROWS = tuple(range(1, 17))
CPU_SWEEP_ROWS = (1, 2, 4, 8, 16)  # the CPU sweep stays tiny: one weight per shape, a few rows
SWEEP_MIN_CALLS, SWEEP_SAMPLES, SWEEP_WARMUPS, CPU_SWEEP_SAMPLES = 32, 5, 2, 3


def _projection(module: torch.nn.Module) -> bool:
    """A Linear, or a `quantized` projection kept as blocks (it sweeps its own GEMV)."""
    from kerneltriage.backends.torch.quantized import QuantLinear

    return isinstance(module, (torch.nn.Linear, QuantLinear))


def projection_shapes(model: Model) -> dict[tuple[int, int], tuple[list[str], list[torch.nn.Module]]]:
    """Every projection of the model grouped by (K, N), with the op class names sharing that shape."""
    shapes: dict[tuple[int, int], tuple[list[str], list[torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        if _projection(module):
            names, modules = shapes.setdefault((module.in_features, module.out_features), ([], []))
            short = name.rsplit(".", 1)[-1]
            names.extend([short] if short not in names else [])
            modules.append(module)
    return shapes


def _weight_bytes(module: torch.nn.Module) -> int:
    """One weight's bytes (a quantized projection's: its blocks)."""
    return module.weight.nbytes if isinstance(module, torch.nn.Linear) else sum(b.nbytes for b in module.buffers())


def _linear_seconds(modules: list[torch.nn.Module], rows: int, cuda: bool) -> float:
    """Per-call seconds of each projection with `rows` random rows, cycling through `modules`."""
    first = next(iter((*modules[0].parameters(), *modules[0].buffers())))
    dtype = getattr(modules[0], "dtype", None) or modules[0].weight.dtype  # QuantLinear: its activations' dtype
    x = torch.randn(rows, modules[0].in_features, device=first.device, dtype=dtype)

    calls = [getattr(module, "product", module) for module in modules]  # quantized: its GEMV, uncounted

    def one_pass() -> None:
        for call in calls:
            call(x)

    if cuda:
        passes = max(1, SWEEP_MIN_CALLS // len(modules))
        return graph_seconds(one_pass, passes, SWEEP_SAMPLES, SWEEP_WARMUPS) / len(modules)
    one_pass()
    times = []
    for _ in range(CPU_SWEEP_SAMPLES):
        start = synced_clock(first.device)
        one_pass()
        times.append(synced_clock(first.device) - start)
    return statistics.median(times) / len(modules)


@torch.inference_mode()
def m_sweep(model: Model, device: torch.device, rows: tuple[int, ...] | None = None) -> list[SweepCurve]:
    """Every projection shape at every row count (CUDA: all of `rows`, default 1…16; CPU: a tiny subset)."""
    cuda = device.type == "cuda"
    rows = rows or (SWEEP_ROWS if cuda else CPU_SWEEP_ROWS)
    curves = []
    for (k, n), (names, modules) in projection_shapes(model).items():
        used = modules if cuda else modules[:1]
        seconds = tuple(_linear_seconds(used, m, cuda) for m in rows)
        curves.append(SweepCurve("/".join(names), k, n, len(used), tuple(rows), seconds,
                                 "cuda graph replay" if cuda else "cpu clock", _weight_bytes(modules[0])))
    return curves
