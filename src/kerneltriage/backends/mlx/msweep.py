"""The M-sweep on MLX: every projection matmul shape of the model at M = 1…16 rows (what speculative verification,
k + 1 rows, feeds it), per-call time on the device at hand, and the kernel family MLX's source routes each row
count to on Metal, CUDA and the CPU (`kernel_rules.py`). A quantized family switch (qmv → qmm) or a loop whose
cost grows with M is where a verify of k + 1 rows stops being nearly free.

Timing: every layer's weight of a shape cycled through, `SWEEP_CALLS` calls evaluated together per sample (an
evaluation per call would time MLX's per-eval overhead, not the matmul), median of samples after a warm-up. The
CPU sweep is small: one weight per shape, a few row counts.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import mlx.nn as nn

from kerneltriage.backends.mlx import kernel_rules
from kerneltriage.backends.mlx.quant import QuantizedEmbedding, QuantizedLinear
from kerneltriage.backends.mlx.runner import Runner
from kerneltriage.engine.probes import SweepCurve

SWEEP_ROWS = tuple(range(1, 17))
CPU_SWEEP_ROWS = (1, 2, 4, 8, 16)
SWEEP_CALLS, SWEEP_SAMPLES, SWEEP_WARMUPS = 16, 5, 1
CPU_SWEEP_CALLS, CPU_SWEEP_SAMPLES = 2, 3
METAL_EXAMPLE = "applegpu_g15s"  # the Metal family is shown for an M3-generation GPU when none is at hand


def projection_shapes(model: nn.Module) -> dict[tuple[int, int], tuple[list[str], list[nn.Module]]]:
    """Every projection of the model (dense or quantized Linear) grouped by (K, N), with the names sharing it."""
    shapes: dict[tuple[int, int], tuple[list[str], list[nn.Module]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, QuantizedLinear)) and not isinstance(module, QuantizedEmbedding):
            n = module.weight.shape[0]
            k = module.weight.shape[1] * (32 // module.bits if isinstance(module, QuantizedLinear) else 1)
            names, modules = shapes.setdefault((k, n), ([], []))
            short = name.rsplit(".", 1)[-1]
            names.extend([short] if short not in names else [])
            modules.append(module)
    return shapes


def _seconds(modules: list[nn.Module], rows: int, dtype: mx.Dtype, calls: int, samples: int) -> float:
    """Per-call seconds of the modules with `rows` random rows, cycling through them."""
    k = modules[0].weight.shape[1] * (32 // modules[0].bits if isinstance(modules[0], QuantizedLinear) else 1)
    x = mx.random.normal((rows, k)).astype(dtype)
    mx.eval(x)
    batch = [modules[i % len(modules)] for i in range(max(calls, len(modules)))]
    matmul = QuantizedLinear.__call__ if isinstance(modules[0], QuantizedLinear) else nn.Linear.__call__  # uncounted
    for _ in range(SWEEP_WARMUPS):
        mx.eval([matmul(module, x) for module in batch])
    times = []
    for _ in range(samples):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval([matmul(module, x) for module in batch])
        mx.synchronize()
        times.append((time.perf_counter() - start) / len(batch))
    return statistics.median(times)


def families(module: nn.Module, k: int, n: int, rows: tuple[int, ...], dtype: str, here: str
             ) -> dict[str, tuple[str, ...]]:
    """device → the kernel family per row count, by MLX's source; dense weights run MLX's dense matmul."""
    if not isinstance(module, QuantizedLinear):
        dense = "dense matmul"
        return {"all devices": tuple(dense for _ in rows)}
    arch = mx.metal.device_info().get("architecture", METAL_EXAMPLE) if here == "metal" else METAL_EXAMPLE
    return {f"metal {arch}": tuple(kernel_rules.metal_qmm(m, k, n, module.bits, arch) for m in rows),
            "cuda sm80/sm90": tuple(kernel_rules.cuda_qmm(m, k, n, dtype) for m in rows),
            "cpu": tuple(kernel_rules.cpu_qmm(module.bits, accelerate=here == "metal") for _ in rows)}


def m_sweep(runner: Runner, rows: tuple[int, ...] | None = None) -> list[SweepCurve]:
    """Every projection shape at every row count (a GPU: all of `rows`, default 1…16; the CPU: a small subset)."""
    cpu = runner.device_type == "cpu"
    rows = rows or (CPU_SWEEP_ROWS if cpu else SWEEP_ROWS)
    calls, samples = (CPU_SWEEP_CALLS, CPU_SWEEP_SAMPLES) if cpu else (SWEEP_CALLS, SWEEP_SAMPLES)
    curves = []
    for (k, n), (names, modules) in projection_shapes(runner.model).items():
        used = modules[:1] if cpu else modules
        seconds = tuple(_seconds(used, m, runner.mx_dtype, calls, samples) for m in rows)
        weight_bytes = sum(a.nbytes for key, a in modules[0].items() if key in ("weight", "scales", "biases"))
        curves.append(SweepCurve("/".join(names), k, n, len(used), tuple(rows), seconds, "mlx eval, synced clock",
                                 weight_bytes, families(modules[0], k, n, tuple(rows), runner.dtype,
                                                       runner.device_type)))
    return curves
