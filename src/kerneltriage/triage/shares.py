"""What triage hands `ab` about a lever besides the timings: the share of each phase the lever can act on (for
`no-lever`) and what the gate audit found in the baseline (checklist point 3).

A lever's share of a phase: the op classes of the seams it replaces plus the host/dispatch gap (a change in the
ops issued moves host time too, so no-lever is claimed only where the step is device-bound and the ops are a
small share); 0 in a phase the lever does not act on; unknown (no share) where no seam says what it touches, or
where a dispatch or loop lever's phase shows no host gap at all (the profile could not tell host from device time:
MLX's, which times each op class apart; on the H200 it called `one_sync`'s measured 1.11× decode a no-lever).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from kerneltriage.engine.levers import LeverSetting
from kerneltriage.engine.probes import GateRow
from kerneltriage.triage.breakdown import Breakdown

SEAM_CLASSES = {"norm": ("norms",), "qkv": ("q_proj", "k_proj", "v_proj"),
                "gate_up": ("gate_proj", "up_proj", "activation"), "attn.decode": ("attention",),
                "attn.prefill": ("attention",), "lm_head": ("output projection",), "o_proj": ("o_proj",),
                "down": ("down_proj",), "linear.gemv": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj", "output projection")}


def lever_shares(setting: LeverSetting, breakdowns: Mapping[str, Breakdown]) -> dict[str, float]:
    """phase → the share of that phase the lever can change at most (phases with no known share left out)."""
    lever, shares = setting.lever, {}
    classes = {cls for seam in lever.seams for cls in SEAM_CLASSES.get(seam, ())}
    for phase, breakdown in breakdowns.items():
        if phase not in lever.phases:
            shares[phase] = 0.0
        elif lever.stage != "model" and not classes and breakdown.gap_share <= 0.0:
            continue  # no gap seen: the class times hold the host's time too (MLX times each class apart)
        elif classes or lever.stage != "model":
            ops = sum(breakdown.shares.get(cls, 0.0) for cls in classes)
            shares[phase] = min(1.0, ops + breakdown.gap_share)
    return shares


def estimated_shares(setting: LeverSetting, breakdowns: Mapping[str, Breakdown],
                     reference: Mapping[str, Breakdown] | None = None) -> dict[str, float]:
    """phase → the share the lever is expected to change, for ordering candidates (not for verdicts): a model-stage
    lever moves the host gap only in proportion to the kernels of its op classes, where a profile attributes kernels
    to classes. A step replayed from a graph attributes nothing: its op classes are then taken from `reference` (a
    profile that did, of the same model), as fractions of the step's device time. Else the ceiling's share."""
    shares = lever_shares(setting, breakdowns)
    classes = {cls for seam in setting.lever.seams for cls in SEAM_CLASSES.get(seam, ())}
    if setting.lever.stage != "model" or not classes:
        return shares
    for phase in [p for p in shares if p in setting.lever.phases]:
        b = _attributed(breakdowns[phase], (reference or {}).get(phase), classes)
        ops = sum(b.shares.get(cls, 0.0) for cls in classes)
        counted = sum(b.class_kernels.get(cls, 0.0) for cls in classes)
        fraction = min(1.0, counted / b.kernels_per_token) if counted and b.kernels_per_token else 1.0
        shares[phase] = min(1.0, ops + b.gap_share * fraction)
    return shares


def _attributed(step: Breakdown, reference: Breakdown | None, classes: set[str]) -> Breakdown:
    """`step`, or — where it names none of `classes` and `reference` does — `step` with its device time split as
    `reference` splits its own (kernel counts too)."""
    if reference is None or any(cls in step.class_seconds for cls in classes) or not reference.device_seconds:
        return step
    scale = step.device_seconds / reference.device_seconds
    counts = reference.kernels_per_token or 1.0
    return Breakdown(step.phase, step.step_seconds, {c: s * scale for c, s in reference.class_seconds.items()},
                     step.host_seconds, step.kernels_per_token,
                     class_kernels={c: n * step.kernels_per_token / counts for c, n in reference.class_kernels.items()})


def seam_shares(seam: str, breakdowns: Mapping[str, Breakdown]) -> dict[str, float]:
    """phase → the share of that phase spent in the op classes of `seam`: what a custom kernel there replaces (its
    device work only: a kernel does not issue fewer ops)."""
    classes = SEAM_CLASSES.get(seam, ())
    phases = {"attn.decode": ("decode",), "attn.prefill": ("prefill",), "linear.gemv": ("decode",)}.get(
        seam, tuple(breakdowns))
    return {phase: sum(b.shares.get(cls, 0.0) for cls in classes) if phase in phases else 0.0
            for phase, b in breakdowns.items()}


def baseline_evidence(gates: Sequence[GateRow]) -> dict[str, str | None]:
    """Checklist point 3 from the gate audit: did the baseline's attention fall off a fused path?"""
    fallen = [row for row in gates if row.default == "math" and row.phase in ("prefill", "decode")]
    if not gates:
        return {}
    problem = None if not fallen else (f"{len(fallen)} attention call shape(s) fall back to math "
                                       f"({', '.join(sorted({row.phase for row in fallen}))})")
    return {"attention backend": problem}
