"""Dispatch gates of MLX's attention at the model's real shapes: which kernel each recorded attention call gets,
here and on the other devices MLX runs on, and what it costs here.

On the device at hand MLX itself answers: `mx.fast.scaled_dot_product_attention(..., force_fused=True)` raises,
with MLX's own reason, when no fused kernel takes the call (on the CPU: none ever does). Which kernel a GPU picks,
and what Metal and CUDA would do with the same call, come from the rules read from MLX's source
(`kernel_rules.py`, which says from which version). Each call is timed here on random data of its shapes, as MLX
dispatches it, and (where that is a fused kernel) through the unfused composition (`sdpa_unfused`'s path).
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx

from kerneltriage.backends.mlx import kernel_rules
from kerneltriage.backends.mlx.attention_levers import unfused_sdpa
from kerneltriage.backends.mlx.device import device_type
from kerneltriage.engine.probes import GateRow, SdpaCall

SDPA_WARMUPS, SDPA_SAMPLES, SDPA_CALLS = 2, 5, 10
UNFUSED = "unfused"
FALLBACK = "math"  # a GPU call no fused kernel takes: the name triage's Q2 knows as the slow fallback


def random_inputs(call: SdpaCall) -> dict:
    """q, k, v of the call's shapes and dtype, its scale, and its mask (a causal one of the recorded shape)."""
    dtype = getattr(mx, call.dtype)
    q = mx.random.normal(call.q).astype(dtype)
    k, v = (mx.random.normal(call.k).astype(dtype) for _ in range(2))
    mask = "causal" if call.is_causal else None
    if call.mask is not None:
        rows, cols = call.mask[-2:]
        mask = mx.arange(cols)[None, :] <= mx.arange(rows)[:, None] + (cols - rows)  # (T, S)
    mx.eval(q, k, v)
    return {"q": q, "k": k, "v": v, "scale": call.q[-1] ** -0.5, "mask": mask}


def fused_here(inputs: dict) -> tuple[bool, str]:
    """Whether MLX has a fused kernel for these inputs on the default device, and its reason when not."""
    try:
        mx.eval(mx.fast.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], scale=inputs["scale"],
                                                     mask=inputs["mask"], force_fused=True))
    except ValueError as exc:
        return False, str(exc)
    return True, ""


def rules(call: SdpaCall, dtype: str) -> dict[str, tuple[str, str]]:
    """What each GPU backend would run the call on, by MLX's source: device → (kernel, why)."""
    q_len, keys, dim = call.q[-2], call.k[-2], call.q[-1]
    array_mask = call.mask is not None
    return {"metal": kernel_rules.metal_sdpa(q_len, keys, dim, call.q[1] // call.k[1], array_mask, call.is_causal),
            "cuda": kernel_rules.cuda_sdpa(q_len, keys, dim, array_mask, call.is_causal, dtype)}


def call_seconds(fn, inputs: dict) -> float:  # noqa: ANN001 - an SDPA function
    """Median seconds per call: SDPA_CALLS independent calls evaluated together, SDPA_SAMPLES times."""
    def batch() -> None:
        mx.eval([fn(inputs["q"], inputs["k"], inputs["v"], scale=inputs["scale"], mask=inputs["mask"])
                 for _ in range(SDPA_CALLS)])

    for _ in range(SDPA_WARMUPS):
        batch()
    samples = []
    for _ in range(SDPA_SAMPLES):
        mx.synchronize()
        start = time.perf_counter()
        batch()
        mx.synchronize()
        samples.append((time.perf_counter() - start) / SDPA_CALLS)
    return statistics.median(samples)


def _default(here: str, fused: bool, kernel: str) -> str:
    """What this device runs the call on: MLX's composed ops on the CPU; on a GPU the fused kernel the rules name,
    the unfused path where MLX prefers it though a kernel exists, or the fallback where none takes the call."""
    if here == "cpu":
        return f"{UNFUSED} (cpu)"
    if not fused:
        return FALLBACK
    return f"{UNFUSED} (MLX prefers it here)" if kernel == UNFUSED else kernel


def gate_row(phase: str, call: SdpaCall, calls_per_pass: float, device: str) -> GateRow:
    """The call's kernel here (asked of MLX), on Metal and CUDA (by the rules), and its cost here."""
    here = device_type(device)
    inputs = random_inputs(call)
    fused, why = fused_here(inputs)
    by_rules = rules(call, call.dtype)
    default = _default(here, fused, by_rules.get(here, (UNFUSED, ""))[0])
    usable = {f"fused on {name}": kernel != UNFUSED for name, (kernel, _) in by_rules.items()}
    usable[f"fused here ({here})"] = fused
    reasons = {f"fused on {name}": [f"{kernel}: {reason}" if reason else kernel]
               for name, (kernel, reason) in by_rules.items()}
    reasons[f"fused here ({here})"] = [why or "MLX's force_fused check passed", kernel_rules.SOURCE_NOTE]
    seconds = {"default": call_seconds(mx.fast.scaled_dot_product_attention, inputs)}
    if fused and not default.startswith(UNFUSED):
        seconds[UNFUSED] = call_seconds(unfused_sdpa, inputs)
    return GateRow(phase, call, calls_per_pass, default, usable, reasons, seconds)
