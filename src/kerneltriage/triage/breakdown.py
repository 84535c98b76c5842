"""Where one phase's time goes: profiled device time per op class against the measured (unprofiled) time
of a forward pass; what the device did not cover is the host/dispatch gap.

shares[class] = device seconds of the class / max(measured seconds, total device seconds), and the gap takes
the rest, so the shares sum to 1. The profiler inflates host time, never kernel time much: the step time comes
from the unprofiled measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

GAP_CLASS = "host/dispatch gap"
DISPATCH_BOUND_GAP = 0.5  # the device idles at least half of each step: the host sets the pace
DEVICE_BOUND_GAP = 0.2  # the device idles at most this share of a step: its own work limits it


@dataclass(frozen=True)
class Breakdown:
    """One phase per forward pass: measured seconds, device seconds per op class, host seconds to issue it."""

    phase: str
    step_seconds: float
    class_seconds: Mapping[str, float]
    host_seconds: float | None  # None where host and device are the same cores (CPU)
    kernels_per_token: float = 0.0
    launches_per_token: float = 0.0
    graph_launches_per_token: float = 0.0
    sync_calls_per_token: float = 0.0
    class_kernels: Mapping[str, float] = field(default_factory=dict)  # op class → kernels per token (probes.py)

    def __post_init__(self) -> None:
        if not self.step_seconds > 0:
            raise ValueError(f"breakdown {self.phase}: step_seconds must be positive, got {self.step_seconds}")

    @property
    def device_seconds(self) -> float:
        return sum(self.class_seconds.values())

    @property
    def shares(self) -> dict[str, float]:
        """Share of the step per op class plus the host/dispatch gap, largest first, summing to 1."""
        total = max(self.step_seconds, self.device_seconds)
        shares = {name: seconds / total for name, seconds in self.class_seconds.items()}
        shares[GAP_CLASS] = 1.0 - self.device_seconds / total
        return dict(sorted(shares.items(), key=lambda item: item[1], reverse=True))

    @property
    def op_shares(self) -> dict[str, float]:
        """The shares of the op classes only (no gap): what a kernel could speed up."""
        return {name: share for name, share in self.shares.items() if name != GAP_CLASS}

    @property
    def gap_share(self) -> float:
        return self.shares[GAP_CLASS]

    @property
    def dispatch_bound(self) -> bool:
        return self.gap_share >= DISPATCH_BOUND_GAP

    @property
    def device_bound(self) -> bool:
        return self.gap_share <= DEVICE_BOUND_GAP

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"shares": self.shares, "device_seconds": self.device_seconds,
                               "gap_share": self.gap_share, "dispatch_bound": self.dispatch_bound,
                               "device_bound": self.device_bound}


def from_profile(profile: Any, step_seconds: float, host_seconds: float | None) -> Breakdown:
    """A Breakdown from a backend PhaseProfile and the measured seconds per forward pass."""
    return Breakdown(profile.phase, step_seconds, dict(profile.class_seconds), host_seconds,
                     profile.kernels_per_token, profile.launches_per_token, profile.graph_launches_per_token,
                     profile.sync_calls_per_token, dict(profile.class_kernels))
