"""Fusion candidates of a graphed, device-bound decode step: the seams of issue 13's custom-kernel path, each with the
kernels it would remove per token and an Amdahl ceiling.

Once graphs have taken the host out of the step, kernel count × time per kernel is the floor. A candidate that
removes r of the step's N kernels per token, each costing on average its kernel time plus its share of the gaps
(step / N), can shorten the step by r / N at most: ceiling = 1 / (1 − r / N). Programmatic dependent launch removes
no kernel; it overlaps each kernel's launch and prologue with the previous one's tail, so its ceiling is the step's
measured gap vanishing, 1 / (1 − gap) (the prologue time inside each kernel is not visible to the profiler).

Kernels removed come from the profile where it attributes kernels to the candidate's op classes (an eager, ungraphed
profile of the same model: a graph replays the kernels it captured), else from the model's structure: each torch op
of the Llama block one kernel, as eager decode launches them (`backends/torch/models/llama.py`). Under `compile`
inductor may already have fused some of those ops, so there the structural count is an upper bound. The ceilings
overlap (the residual adds appear in two candidates): each is that candidate alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from kerneltriage.engine.levers import LEVERS, LeverSetting, Place, parse_setting, refusal
from kerneltriage.triage.amdahl import speedup_if_free
from kerneltriage.triage.breakdown import Breakdown

MAX_SHARE = 0.999  # a ceiling stays finite when the counts say everything could go
# Eager kernels per op of one Llama block at decode (one token), counted from the model's code:
RESIDUAL_ADDS = 2  # x + attn(…), x + mlp(…)
NORMS = 2  # input_layernorm, post_attention_layernorm
NORM_KERNELS = {"fused_norm": 1, "float32": 2, "other": 4}  # F.rms_norm(weight); rms_norm, ·weight; + two casts
ACTIVATION_KERNELS = 2  # F.silu(gate), · up
ROPE_KERNELS = 2 * 5  # q and k: −x[half:], cat, x·cos, rotated·sin, +
CACHE_WRITE_KERNELS = 2  # k and v copied into the cache
STATIC_MASK_KERNELS = 1  # graphs' static cache: the mask repeated for the folded query heads (grouped_attention)


@dataclass(frozen=True)
class Candidate:
    """One fusion: the seam it replaces, the op classes whose kernels it folds (`kept` per layer survive, 0: into a
    neighbouring GEMV), the residual adds it absorbs per layer (never isolated by the profile: they share the
    block's "other" class with its reshapes), and `gap`: it overlaps kernels instead of removing them (PDL)."""

    name: str
    seam: str
    summary: str
    classes: tuple[str, ...] = ()
    kept: int = 0
    adds: int = 0
    gap: bool = False


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("add_norm", "add_norm", "residual add + RMSNorm as one kernel", ("norms",), kept=NORMS,
              adds=RESIDUAL_ADDS),
    Candidate("norm_prologue", "norm", "RMSNorm folded into the next GEMV's prologue (qkv, gate_up)", ("norms",)),
    Candidate("gate_up_silu", "gate_up", "gate_up GEMV with SiLU·mul in its epilogue", ("activation",)),
    Candidate("residual_epilogue", "o_proj, down", "down and o_proj GEMVs with the residual add in their epilogue",
              adds=RESIDUAL_ADDS),
    Candidate("qkv_rope_cache", "qkv", "qkv GEMV with RoPE and the KV-cache write in its epilogue",
              ("rope", "kv cache")),
    Candidate("split_kv_attention", "attn.decode", "split-KV decode attention as one kernel (its larger gain is "
              "bandwidth at depth: Q2's cost of context)", ("attention",), kept=1),
    Candidate("pdl", "all", "programmatic dependent launch: each kernel's launch and prologue under the previous "
              "one's tail", gap=True),
)


BUILT_BY = "fused_layer"  # the lever that builds these fusions (its row in engine/levers.py says where it runs)


@dataclass(frozen=True)
class Structure:
    """What the structural count needs: layers, and the levers and dtype that change the block's kernels; the
    architecture and backend say whether the `fused_layer` lever (these fusions, built) can take the model."""

    layers: int
    levers: tuple[str, ...]
    dtype: str
    arch: str = "llama"
    backend: str = "torch"

    @property
    def fused_layer_offered(self) -> bool:
        """`fused_layer` would run here and is not on yet."""
        on = tuple(parse_setting(text) for text in self.levers)
        return BUILT_BY not in self.levers and refusal(LeverSetting(LEVERS[BUILT_BY]), on,
                                                       Place(self.backend, "cuda", self.arch)) is None

    def class_kernels(self, cls: str) -> float:
        """Eager kernels per layer of one op class."""
        norm = NORM_KERNELS["fused_norm" if "fused_norm" in self.levers else
                            "float32" if self.dtype == "float32" else "other"]
        attention = STATIC_MASK_KERNELS + 1 if "graphs" in self.levers else 1
        return {"norms": NORMS * norm, "activation": ACTIVATION_KERNELS, "rope": ROPE_KERNELS,
                "kv cache": CACHE_WRITE_KERNELS, "attention": attention}[cls]

    @property
    def compiled(self) -> bool:
        return "compile" in self.levers


@dataclass(frozen=True)
class FusionRow:
    """One candidate on one graphed step: kernels removed per token (and where that count came from), the share of
    the step they stand for, and the Amdahl ceiling."""

    candidate: str
    seam: str
    summary: str
    kernels_removed: float  # per token
    source: str  # "profile", "structure", "structure (upper bound: compiled)" or "measured gap"
    share: float
    ceiling: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _removed(candidate: Candidate, attributed: Mapping[str, float], structure: Structure) -> tuple[float, str]:
    """(kernels removed per token, source): from the attributed profile's classes where it has them all."""
    adds = candidate.adds * structure.layers
    kept = candidate.kept * structure.layers
    if candidate.classes and all(cls in attributed for cls in candidate.classes):
        return max(0.0, sum(attributed[cls] for cls in candidate.classes) - kept) + adds, "profile"
    folded = sum(structure.class_kernels(cls) for cls in candidate.classes) * structure.layers
    source = "structure (upper bound: compiled)" if structure.compiled else "structure"
    return max(0.0, folded - kept) + adds, source


def rows(graphed: Breakdown, attributed: Mapping[str, float], structure: Structure) -> list[FusionRow]:
    """Every candidate on the graphed step, largest ceiling first. `attributed`: kernels per token per op class
    from a profile that attributes them (empty where none does)."""
    if not graphed.kernels_per_token > 0:
        raise ValueError(f"fusion rows: the graphed step counted {graphed.kernels_per_token} kernels per token")
    found = []
    for candidate in CANDIDATES:
        if candidate.gap:
            removed, source, share = 0.0, "measured gap", graphed.gap_share
        else:
            removed, source = _removed(candidate, attributed, structure)
            share = removed / graphed.kernels_per_token
        found.append(FusionRow(candidate.name, candidate.seam, candidate.summary, removed, source, share,
                               speedup_if_free(min(share, MAX_SHARE))))
    return sorted(found, key=lambda row: row.ceiling, reverse=True)
