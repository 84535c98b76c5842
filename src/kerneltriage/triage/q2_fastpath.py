"""Question 2 — can I unlock an existing fast path? Findings from the SDPA gate table, the M-sweep of
every projection, decode's cost of context, and the op census (casts, non-contiguous copies, ops left on the CPU).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kerneltriage.engine.levers import LEVERS
from kerneltriage.triage.amdahl import speedup, speedup_if_free
from kerneltriage.triage.finding import Finding

if TYPE_CHECKING:
    from kerneltriage.engine.probes import GateRow, SdpaCall, SweepCurve
    from kerneltriage.triage.context import ContextCost

QUESTION = "fast-path"
FASTER_BACKEND_MARGIN = 0.10  # an alternative this much faster per call than the default is a missed gate
STALL_RATIO = 1.5  # per-call cost jumping by this factor from one row count to the next: a tuning-grid hole
NON_MONOTONE_TOLERANCE = 0.15  # fewer rows costing this much more than some larger row count
GEMV_BANDWIDTH_MIN = 0.70  # a projection at M = 1 reading its weight below this fraction of copy bandwidth …
GEMV_BANDWIDTH_TARGET = 0.90  # … could reach about this (the large stock GEMVs do on an H200)
GEMV_MIN_BYTES = 16e6  # smaller weights are judged by launch cost and L2, not by bandwidth: no claim
CONTEXT_SHARE_MIN = 0.10  # context cost below this share of a deep decode token is not worth a finding …
KV_BANDWIDTH_MIN = 0.25  # … nor is attention reading the cache at this fraction of copy bandwidth or more
KV_BANDWIDTH_TARGET = 0.90  # a split-KV decode attention could read it at about this
COPIES_SHARE_MIN = 0.02  # copies/casts below this share of a phase are not worth a finding
MAX_SHARE = 0.999  # keeps an Amdahl bound finite when a share rounds to the whole step
CLASS_OF_LINEAR = {"lm_head": "output projection"}


def describe(call: SdpaCall) -> str:
    """'1 query × 4096 keys, 32/8 heads, head_dim 64'."""
    queries = call.q[-2]
    return (f"{queries} quer{'y' if queries == 1 else 'ies'} × {call.k[-2]} keys, "
            f"{call.q[1]}/{call.k[1]} heads, head_dim {call.q[-1]}")


PAD_LEVER = "sdpa_pad"  # where no fused backend takes the shape at all: the lever that pads it to one that does


def _best_alternative(row: GateRow) -> tuple[str, float] | None:
    options = {name: s for name, s in row.seconds.items() if name not in ("default", row.default)}
    return min(options.items(), key=lambda item: item[1]) if options else None


def _lever_for(backend: str) -> str | None:
    """The lever that gets an alternative: K/V expanded to every query head is what `sdpa_fold` gets without
    the copy; a plain backend is `sdpa_backend=NAME`; a path with a lever of its own is `sdpa_NAME`."""
    from kerneltriage.engine.probes import EXPANDED

    if backend.endswith(EXPANDED):
        return "sdpa_fold"
    if backend in LEVERS["sdpa_backend"].choices:
        return f"sdpa_backend={backend}"
    return f"sdpa_{backend}" if f"sdpa_{backend}" in LEVERS else None  # MLX: "unfused" → sdpa_unfused


def math_fallback(row: GateRow, step_seconds: float) -> Finding | None:
    """A GPU attention call that dispatch sends to the math backend: torch's reasons, and its cost."""
    if row.default != "math" or not row.seconds:
        return None
    per_pass = row.seconds["default"] * row.calls_per_pass
    best = _best_alternative(row)
    saving = 0.0 if best is None else max(0.0, row.seconds["default"] - best[1]) * row.calls_per_pass
    fix = ("no fused backend takes this shape: change it (e.g. a supported head_dim) or write the kernel"
           if best is None else f"run it on {best[0]}: {best[1] * 1e6:.0f} µs instead of "
           f"{row.seconds['default'] * 1e6:.0f} µs per call")
    return Finding(
        QUESTION, f"sdpa-math-fallback-{row.phase}",
        f"{row.phase} attention ({describe(row.call)}) falls back to math: no fused backend takes it",
        {"call": asdict(row.call), "reasons": row.reasons, "seconds_per_call": row.seconds,
         "calls_per_pass": row.calls_per_pass, "cost_share": min(per_pass / step_seconds, 1.0),
         "best_alternative": best},
        speedup_if_free(min(saving / step_seconds, MAX_SHARE)), None, "estimated", fix, row.phase,
        PAD_LEVER if best is None else _lever_for(best[0]))


def slower_default(row: GateRow, step_seconds: float) -> Finding | None:
    """Dispatch picked a backend although another one, also usable, is measurably faster at this shape."""
    best = _best_alternative(row)
    if row.default == "math" or best is None or best[1] >= row.seconds["default"] * (1 - FASTER_BACKEND_MARGIN):
        return None
    saving = (row.seconds["default"] - best[1]) * row.calls_per_pass
    return Finding(
        QUESTION, f"sdpa-slower-default-{row.phase}",
        f"{row.phase} attention ({describe(row.call)}): default {row.default} "
        f"{row.seconds['default'] * 1e6:.0f} µs, {best[0]} {best[1] * 1e6:.0f} µs per call",
        {"call": asdict(row.call), "reasons": row.reasons, "seconds_per_call": row.seconds,
         "calls_per_pass": row.calls_per_pass},
        speedup_if_free(min(saving / step_seconds, MAX_SHARE)), None, "estimated",
        f"pin attention to {best[0]}" + (f" (--levers {_lever_for(best[0])})" if _lever_for(best[0]) else ""),
        row.phase, _lever_for(best[0]))


def sweep_holes(curve: SweepCurve) -> list[dict[str, Any]]:
    """Row counts where the per-call cost jumps (stall) or exceeds that of a larger row count (non-monotone)."""
    holes, seconds = [], curve.seconds
    for i, rows in enumerate(curve.rows):
        if i and seconds[i] > seconds[i - 1] * STALL_RATIO:
            holes.append({"rows": rows, "kind": "stall", "ratio": seconds[i] / seconds[i - 1]})
        later = seconds[i + 1:]
        if later and seconds[i] > min(later) * (1 + NON_MONOTONE_TOLERANCE):
            holes.append({"rows": rows, "kind": "non-monotone", "ratio": seconds[i] / min(later)})
    return holes


def _decode_share(curve: SweepCurve, decode_shares: Mapping[str, float]) -> float:
    """The share of decode spent in the projections this curve stands for (e.g. q_proj/o_proj: both)."""
    return sum(decode_shares.get(CLASS_OF_LINEAR.get(name, name), 0.0) for name in curve.name.split("/"))


def sweep_finding(curve: SweepCurve, decode_shares: Mapping[str, float], reliable: bool) -> Finding | None:
    """One projection shape with a hole in its tuning grid: what verifying at that row count costs extra."""
    holes = sweep_holes(curve)
    if not holes:
        return None
    worst = max(holes, key=lambda hole: hole["ratio"])
    share = _decode_share(curve, decode_shares)
    return Finding(
        QUESTION, f"m-sweep-{curve.name}",
        f"{curve.name} ({curve.k}→{curve.n}): per-call cost {worst['kind']} at M={worst['rows']} "
        f"({worst['ratio']:.2f}×)",
        {"curve": curve.to_dict(), "holes": holes, "decode_share": share},
        speedup(min(share, 1.0), worst["ratio"]), None, "estimated" if reliable else "low",
        f"avoid M={worst['rows']} in speculative verify (pick k so that k+1 misses the hole) or pad to a fast M",
        "decode")


def gemv_bandwidth_finding(curve: SweepCurve, decode_shares: Mapping[str, float],
                           copy_bandwidth: float | None) -> Finding | None:
    """A projection whose one-row matmul (a decode GEMV) reads its weight well below the copy bandwidth: the
    stock kernel at this shape is not bandwidth-bound, so decode pays for it beyond the roofline."""
    if curve.timer != "cuda graph replay" or not copy_bandwidth or curve.rows[0] != 1:
        return None  # only GPU GEMVs timed without the host in the way say anything about the kernel
    if curve.weight_bytes < GEMV_MIN_BYTES:
        return None
    fraction = curve.bandwidth() / copy_bandwidth
    if fraction >= GEMV_BANDWIDTH_MIN:
        return None
    share = _decode_share(curve, decode_shares)
    return Finding(
        QUESTION, f"gemv-bandwidth-{curve.name}",
        f"{curve.name} ({curve.k}→{curve.n}) at M=1 reads its weight at {curve.bandwidth() / 1e12:.2f} TB/s, "
        f"{fraction:.0%} of copy bandwidth",
        {"curve": curve.to_dict(), "fraction": fraction, "decode_share": share},
        speedup(min(share, 1.0), GEMV_BANDWIDTH_TARGET / fraction), None, "estimated",
        "try compile=max-autotune-no-cudagraphs (Triton GEMVs) or a packed projection (a wider N streams better); "
        "a hand GEMV is a kernel question — judge it with ab", "decode")


def context_finding(cost: ContextCost, context: float, copy_bandwidth: float | None, gpu: bool,
                    levers: Sequence[str]) -> Finding | None:
    """Decode slowing with context far beyond what reading K and V at copy bandwidth explains: the decode
    attention kernel does not use the device (at batch 1, masked SDPA runs one block per KV head). The gain is
    the workload's, at its mean decode `context`: the cost per position measured, against reading at 90% of copy
    bandwidth."""
    bandwidth = cost.read_bandwidth
    if not copy_bandwidth or bandwidth is None or cost.share < CONTEXT_SHARE_MIN:
        return None
    fraction = bandwidth / copy_bandwidth
    if fraction >= KV_BANDWIDTH_MIN:
        return None
    now = cost.shallow_seconds + context * cost.extra_seconds / cost.depth
    fast = cost.shallow_seconds + context * cost.kv_bytes_per_position / (KV_BANDWIDTH_TARGET * copy_bandwidth)
    lever = "flex_decode" if gpu and "flex_decode" not in levers else None
    fix = ("a split-KV decode attention (flash-decoding) spreads the keys over the device: --levers flex_decode"
           if lever else "a decode attention kernel that splits the keys across the device (flash-decoding)")
    return Finding(
        QUESTION, "context-attention",
        f"decode at depth {cost.depth} is {cost.extra_seconds * 1e3:.2f} ms/token slower than at depth 0: the KV "
        f"cache read at {bandwidth / 1e9:.0f} GB/s ({fraction:.1%} of copy bandwidth), {cost.share:.0%} of each "
        "token there",
        {"context": cost.to_dict(), "fraction": fraction, "workload_context": context}, now / fast, None,
        "estimated" if gpu else "low", fix, "decode", lever=lever)


def copies_finding(phase: str, census: Mapping[str, Any], share: float) -> Finding | None:
    """Casts and non-contiguous copies that take a measurable share of a phase."""
    count = census.get("casts", 0) + census.get("strided_copies", 0)
    if share < COPIES_SHARE_MIN or count == 0:
        return None
    return Finding(
        QUESTION, f"copies-casts-{phase}",
        f"{census['casts']:.0f} casts and {census['strided_copies']:.0f} non-contiguous copies per "
        f"{'token' if phase == 'decode' else 'prefill'}: {share:.0%} of {phase}",
        {"census": dict(census), "share": share},
        speedup_if_free(min(share, MAX_SHARE)), None, "estimated",
        "keep activations in the run dtype and contiguous where they are made, or fuse the cast (compile)", phase)


def cpu_ops_finding(census: Mapping[str, Any], gpu: bool) -> Finding | None:
    """Ops that ran on the CPU while the model runs on a GPU (each one a host round trip waiting to happen)."""
    if not gpu or census.get("cpu_ops", 0) == 0:
        return None
    return Finding(
        QUESTION, "cpu-ops", f"{census['cpu_ops']:.1f} ops per token ran on the CPU",
        {"sites": census.get("cpu_op_sites", {})}, 1.0, None, "estimated",
        "create those tensors on the device (or keep host bookkeeping out of the step)", "decode")


def analyze(gate_rows: Sequence[GateRow], curves: Sequence[SweepCurve], census: Mapping[str, Mapping[str, Any]],
            shares: Mapping[str, Mapping[str, float]], step_seconds: Mapping[str, float], gpu: bool,
            copy_bandwidth: float | None = None, context: ContextCost | None = None, decode_context: float = 0.0,
            levers: Sequence[str] = ()) -> list[Finding]:
    """Every Q2 finding: attention gates, M-sweep holes and GEMV bandwidth, decode's cost of context,
    copies/casts and CPU ops."""
    found: list[Finding | None] = []
    for row in gate_rows:
        found += [math_fallback(row, step_seconds[row.phase]), slower_default(row, step_seconds[row.phase])]
    found += [sweep_finding(curve, shares["decode"], gpu) for curve in curves]
    found += [gemv_bandwidth_finding(curve, shares["decode"], copy_bandwidth) for curve in curves]
    if context is not None:
        found.append(context_finding(context, decode_context, copy_bandwidth, gpu, levers))
    found += [copies_finding(phase, census[phase], shares[phase].get("copies/casts", 0.0)) for phase in census]
    found.append(cpu_ops_finding(census.get("decode", {}), gpu))
    return [f for f in found if f is not None]
