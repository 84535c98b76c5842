"""Question 3 — can I cut dispatch/sync overhead? Launches and syncs per decode token (with call sites), host
versus device time per step, and the graphed step's kernels (the dispatch levers themselves are the climb's).
"""

from __future__ import annotations

from typing import Any, Mapping

from kerneltriage.triage import fusion
from kerneltriage.triage.amdahl import speedup_if_free
from kerneltriage.triage.breakdown import Breakdown
from kerneltriage.triage.finding import Finding

QUESTION = "dispatch"
GRAPHED_STEP = "graphed-step"
GAP_SHARE_MIN = 0.10  # a host/dispatch gap below this share of a decode step is not worth a finding
SYNCS_PER_TOKEN_FLOOR = 1.0  # streaming needs one readback per token; more than that is a planted wait
SYNC_TOLERANCE = 0.05  # per-token counts are averages over the profiled window
MAX_SHARE = 0.999
# A graphed step is worth fusing when its kernels are many and small. A fused Llama decode layer needs about six
# (norm+qkv, attention, o_proj+residual, norm+gate_up, down+residual, and one more): issue 13's reference point runs
# Llama-3.2-1B's 16 layers in ~100 kernels per step. Twice that per layer is "many".
MANY_KERNELS_PER_LAYER = 12
# Below this mean time a kernel's fixed cost (launch, prologue, tail: a few µs) is a large part of it.
SMALL_KERNEL_SECONDS = 10e-6


def dispatch_gap(decode: Breakdown, gpu: bool) -> Finding | None:
    """The device idles while the host issues the step: kernels per token, host vs device time."""
    gap = decode.gap_share
    if gap < GAP_SHARE_MIN:
        return None
    device = "GPU" if gpu else "CPU (op time)"
    bound = "decode is dispatch-bound: " if decode.dispatch_bound else ""
    per_token = f"{decode.kernels_per_token:.0f} kernels, {decode.launches_per_token:.0f} launches per token"
    counts = f" ({per_token})" if gpu else ""
    return Finding(
        QUESTION, "dispatch-gap", f"{bound}the {device} is idle {gap:.0%} of each decode step{counts}",
        {"gap_share": gap, "step_seconds": decode.step_seconds, "device_seconds": decode.device_seconds,
         "host_seconds": decode.host_seconds, "kernels_per_token": decode.kernels_per_token,
         "launches_per_token": decode.launches_per_token,
         "graph_launches_per_token": decode.graph_launches_per_token},
        speedup_if_free(min(gap, MAX_SHARE)), None, "ceiling",
        "capture the decode step in CUDA graphs (--levers graphs) or compile it" if gpu
        else "less Python per step: compile the step (torch.compile) or batch more work per op",
        "decode", "graphs" if gpu else None)


def syncs_per_token(decode: Breakdown, census: Mapping[str, Any], gpu: bool) -> tuple[float, str]:
    """(syncs per token, what was counted): CUDA runtime sync calls on a GPU, host readbacks on the CPU."""
    if gpu:
        return decode.sync_calls_per_token, "CUDA runtime synchronizing calls"
    return float(census.get("readbacks", 0.0)), "host readbacks (each would be a sync on a GPU)"


def extra_syncs(decode: Breakdown, census: Mapping[str, Any], gpu: bool) -> Finding | None:
    """More host↔device syncs per token than the one a streaming loop needs, with their call sites (the climb
    measures what one_sync does about them)."""
    count, what = syncs_per_token(decode, census, gpu)
    if count <= SYNCS_PER_TOKEN_FLOOR + SYNC_TOLERANCE:
        return None
    return Finding(
        QUESTION, "extra-syncs", f"{count:.1f} host↔device syncs per decode token (one is enough)",
        {"syncs_per_token": count, "counted": what, "readback_sites": census.get("readback_sites", {})},
        1.0, None, "estimated",
        "read the token once per step and queue the next step before reading it (--levers one_sync); "
        "remove the other readbacks at the sites listed", "decode", "one_sync")


def seconds_per_kernel(step: Breakdown) -> float:
    """Mean device seconds per kernel of a decode step (one token per pass)."""
    return step.device_seconds / step.kernels_per_token


def many_small_kernels(step: Breakdown, layers: int) -> bool:
    """Graphs took the host out and kernel count × time per kernel is now the floor."""
    return (step.device_bound and step.kernels_per_token >= MANY_KERNELS_PER_LAYER * layers
            and seconds_per_kernel(step) <= SMALL_KERNEL_SECONDS)


def graphed_step(graphed: Breakdown | None, attributed: Mapping[str, float], structure: fusion.Structure,
                 gpu: bool) -> Finding | None:
    """A graphed, device-bound step of many small kernels: its kernels per token, µs per kernel and gap, with one
    fusion candidate per row and its Amdahl ceiling (nothing on the CPU, nor where the step is host-bound: there
    graphs itself is the answer)."""
    if not gpu or graphed is None or not many_small_kernels(graphed, structure.layers):
        return None
    rows = fusion.rows(graphed, attributed, structure)
    count, per_kernel = graphed.kernels_per_token, seconds_per_kernel(graphed)
    return Finding(
        QUESTION, GRAPHED_STEP, f"graphed step: {count:.0f} kernels per token, {per_kernel * 1e6:.2f} µs per "
        f"kernel, device-bound (gap {graphed.gap_share:.0%})",
        {"kernels_per_token": count, "seconds_per_kernel": per_kernel, "gap_share": graphed.gap_share,
         "step_seconds": graphed.step_seconds, "device_seconds": graphed.device_seconds,
         "breakdown": graphed.to_dict(), "candidates": [row.to_dict() for row in rows]},
        rows[0].ceiling, None, "ceiling", _fusion_fix(structure), "decode",
        "fused_layer" if structure.fused_layer_offered else None)


def _fusion_fix(structure: fusion.Structure) -> str:
    if structure.fused_layer_offered:
        return ("--levers fused_layer,graphs: every candidate above but add_norm, built as six Triton kernels per "
                "layer (add pdl on compute capability 9.0+: programmatic dependent launch, 1.10× decode on an H200); "
                "judge it with `kerneltriage ab` against this set")
    return ("fewer, larger kernels: fuse at the seams listed (`kerneltriage kernel`), the largest ceiling first; "
            "each ceiling is that candidate alone")


def analyze(decode: Breakdown, census: Mapping[str, Any], gpu: bool) -> list[Finding]:
    """Every Q3 detector but the graphed step's: the dispatch gap and extra syncs (the climb measures the levers)."""
    found = [dispatch_gap(decode, gpu), extra_syncs(decode, census, gpu)]
    return [f for f in found if f is not None]
