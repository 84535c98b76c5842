"""Decode's cost of context: the same short decode at depth 0 and at a deeper depth, each in a cache of its own.

The per-token difference is what attending over the extra positions costs; set against the bytes of K and V
those positions hold, it is the rate at which decode attention reads the cache. A profiler cannot say this under
graphs (a replay's kernels are not attributed); two timings can.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kerneltriage.bench.workloads import Test
from kerneltriage.core import roofline


@dataclass(frozen=True)
class ContextCost:
    """Seconds per decode token at context depth 0 and at `depth`, and the KV bytes one position holds."""

    depth: int
    tokens: int
    shallow_seconds: float  # per token, decoding from depth 0
    deep_seconds: float  # per token, decoding from `depth`
    kv_bytes_per_position: float

    @property
    def extra_seconds(self) -> float:
        """Per token: what the `depth` extra positions add."""
        return self.deep_seconds - self.shallow_seconds

    @property
    def share(self) -> float:
        """The extra's fraction of a deep token."""
        return max(self.extra_seconds, 0.0) / self.deep_seconds

    @property
    def read_bandwidth(self) -> float | None:
        """Bytes per second at which the extra positions' K and V are read (None: no measurable extra)."""
        if self.extra_seconds <= 0:
            return None
        return self.kv_bytes_per_position * self.depth / self.extra_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"extra_seconds": self.extra_seconds, "share": self.share,
                               "read_bandwidth": self.read_bandwidth}


def measure_context(runner: Any, depth: int, tokens: int, repeats: int, warmups: int) -> ContextCost:
    """tg`tokens` at depth 0 and at `depth` on `runner`, the median per token of each."""
    from kerneltriage.bench.harness import Settings, run_test

    settings = Settings(repeats=repeats, warmups=warmups)
    seconds = []
    for test in (Test("tg", tokens, 0), Test("tg", tokens, depth)):
        runner.drop_cache()  # a cache of this test's size: a compiled graph attends over all of it
        seconds.append(run_test(runner, test, settings).timed.median / tokens)
    per_position = roofline.kv_bytes(runner.config, 1, runner.dtype_bytes)
    return ContextCost(depth, tokens, seconds[0], seconds[1], per_position)
