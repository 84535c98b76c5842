"""A Finding: one answer to one of the three questions, with its evidence and its gain.

Gains are end-to-end speedups of one phase (time before / time after: 1.25 = 25% faster). The estimate
comes from an Amdahl bound on measured shares; the measured gain from an actual paired A/B, when a
lever exists for it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from kerneltriage.engine.levers import PHASES, QUESTIONS

# "measured": an A/B ran; "estimated": Amdahl on measured shares; "ceiling": an upper bound (the op made
# free); "low": timings too noisy to trust (the CPU path of GPU-oriented probes).
CONFIDENCES = ("measured", "estimated", "ceiling", "low")


@dataclass(frozen=True)
class Finding:
    """(question, code, title, evidence, estimated_gain, measured_gain | None, confidence, fix), for one phase."""

    question: str
    code: str
    title: str
    evidence: Mapping[str, Any]
    estimated_gain: float
    measured_gain: float | None
    confidence: str
    fix: str
    phase: str = "decode"
    lever: str | None = field(default=None)  # the lever that implements the fix, when one exists

    def __post_init__(self) -> None:
        if self.question not in QUESTIONS:
            raise ValueError(f"finding {self.code}: question {self.question!r} not in {QUESTIONS}")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"finding {self.code}: confidence {self.confidence!r} not in {CONFIDENCES}")
        if self.phase not in PHASES:
            raise ValueError(f"finding {self.code}: phase {self.phase!r} not in {PHASES}")
        for name in ("estimated_gain", "measured_gain"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"finding {self.code}: {name}={value!r}, expected a positive speedup")

    @property
    def gain(self) -> float:
        """The measured gain when there is one, else the estimate: what ranking uses."""
        return self.estimated_gain if self.measured_gain is None else self.measured_gain

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"evidence": dict(self.evidence)}
