"""Plain records of what a backend's probes saw, for triage's analyzers (no framework in them): attention calls
as the model made them and their dispatch gates, projection sweeps, profiled windows, attention sparsity."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

EXPANDED = "+expand_kv"  # suffix of a gate alternative: K/V repeated to every query head, enable_gqa off

@dataclass(frozen=True)
class SdpaCall:
    """One attention call as the model made it (shapes, not data)."""

    q: tuple[int, ...]  # (B, H, T, D)
    k: tuple[int, ...]  # (B, Hkv, S, D)
    dtype: str
    mask: tuple[int, ...] | None
    is_causal: bool
    enable_gqa: bool
    mask_is_causal: bool | None = None  # on a fresh prompt (T == S): is the explicit mask exactly causal?

    @property
    def fresh_prompt(self) -> bool:
        """As many queries as keys, more than one: a prompt on an empty cache."""
        return self.q[-2] == self.k[-2] > 1

    def signature(self) -> tuple:
        """Everything but the key length (which grows every decode step)."""
        return (self.q, self.k[:-2], self.k[-1], self.dtype, self.mask is not None, self.is_causal, self.enable_gqa)


@dataclass(frozen=True)
class GateRow:
    """One distinct attention call of one phase: what it got, what else could run it, and at what cost."""

    phase: str
    call: SdpaCall
    calls_per_pass: float
    default: str  # the backend torch's dispatch picks ("math", "flash", …; "flash (cpu)" on the CPU)
    usable: dict[str, bool] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)  # backend → torch's debug warnings
    seconds: dict[str, float] = field(default_factory=dict)  # per call: "default", "math", usable backends, …

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def distinct_calls(calls: list[SdpaCall], passes: int) -> list[tuple[SdpaCall, float]]:
    """One representative per signature (the longest key length seen) and its calls per forward pass."""
    counts = Counter(call.signature() for call in calls)
    longest: dict[tuple, SdpaCall] = {}
    for call in calls:
        best = longest.get(call.signature())
        if best is None or call.k[-2] > best.k[-2]:
            longest[call.signature()] = call
    return [(call, counts[sig] / passes) for sig, call in longest.items()]


def at_keys(call: SdpaCall, keys: int) -> SdpaCall:
    """The same call over `keys` keys (a decode step deeper in the generation)."""
    mask = None if call.mask is None else call.mask[:-1] + (keys,)
    return dataclasses.replace(call, k=call.k[:-2] + (keys, call.k[-1]), mask=mask)


@dataclass(frozen=True)
class SweepCurve:
    """Per-call seconds of one projection shape (x (M, K) @ Wᵀ, W (N, K)) at each row count M."""

    name: str  # the op classes with this shape, e.g. "gate_proj/up_proj"
    k: int
    n: int
    weights: int  # distinct weights cycled through (every layer's: none stays cache-resident)
    rows: tuple[int, ...]
    seconds: tuple[float, ...]
    timer: str  # "cuda graph replay" or "cpu clock"
    weight_bytes: int  # one weight's bytes: what a bandwidth-bound call at small M reads
    # device → the kernel family each row count gets, where the backend knows its library's routing (MLX: read from
    # its source); empty where it does not
    kernels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def bandwidth(self, index: int = 0) -> float:
        """Weight bytes read per second at rows[index] (M = 1 first): a GEMV's achieved bandwidth."""
        return self.weight_bytes / self.seconds[index]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PhaseProfile:
    """One profiled window. Times in seconds per forward pass (`passes` of them); counts per token."""

    phase: str
    passes: int
    tokens: int
    class_seconds: dict[str, float]
    busy_seconds: float  # device busy time (union of kernel intervals; CPU: op time) per pass
    kernels_per_token: float
    launches_per_token: float  # kernel launch calls (CUDA runtime); a graph launch counts once
    graph_launches_per_token: float
    sync_calls_per_token: float  # CUDA runtime synchronizing calls; 0 on the CPU
    profiled_seconds: float  # wall time per pass under the profiler (inflated by it)
    output_rows: tuple[int, ...] = ()  # rows the output projection computed, per call
    attention_calls: tuple[SdpaCall, ...] = ()  # every SDPA call inside the window, as the model made it
    # op class → kernels per token launched from it; a graph replay's kernels are one unattributed class, and a
    # compiled step's one "other" class (its ranges are left out): there the counts cannot say what each op costs
    class_kernels: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sparsity:
    """Fraction of attention weights below `threshold` at prompt depth `depth`, overall and per layer; `skippable`:
    the fraction of V rows (per KV head and query) that every query head sharing that KV head weighs below it — what
    sparse-V can leave unread (None: not measured)."""

    depth: int
    threshold: float
    fraction: float
    per_layer: tuple[float, ...]
    skippable: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KernelCheck:
    """A custom kernel against the stock op in float32 at one shape: its error, the stock op's own error in the run
    dtype (the bound is a multiple of it), output elements it left unwritten, and exactness where it claims it."""

    seam: str
    rows: int
    depth: int
    shape: str
    error: float  # max |kernel − reference| / max |reference|, worst over the trials
    stock_error: float
    tolerance: float
    unwritten: int
    exact: bool | None = None  # claimed exact: equal to the stock op in the run dtype (None: not claimed)
    trial: str = "fresh-inputs"  # the first trial failed (else the worst's): fresh-inputs, same-pointers, unseen-shape
    caught: tuple[str, ...] = ()  # guards that fired at this shape, each "guard: what it saw"
    labels: tuple[str, ...] = ()  # what was found that fails nothing (stock-call)
    dtype: str = ""  # the run dtype the kernel was called in

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.error <= self.tolerance and self.exact is not False and not self.caught

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


@dataclass(frozen=True)
class KernelTiming:
    """Seconds per call of a kernel and of the stock op at one shape, in one lane: "chained" (serial calls, each
    waiting for the last, like a decode step; CUDA: replayed from a graph), "queued" (many in flight) or "cold" (the
    first call at shapes never seen before)."""

    seam: str
    rows: int
    depth: int
    lane: str
    kernel_seconds: float  # the median of kernel_samples
    stock_seconds: float
    timer: str
    kernel_samples: tuple[float, ...] = ()  # raw seconds per call, one per sample
    stock_samples: tuple[float, ...] = ()
    bytes_moved: float = 0.0  # what one call must read and write (inputs and output)
    flops: float = 0.0  # what one call must compute
    flushed: bool = False  # inputs rotated beyond the caches, the L2 flushed before each sample: a roofline applies
    caught: tuple[str, ...] = ()  # timing guards that fired, each "guard: what it saw"
    labels: tuple[str, ...] = ()  # what was found that fails nothing (bimodal)

    @property
    def ratio(self) -> float:
        """Stock time / kernel time: > 1, the kernel is faster in isolation."""
        return self.stock_seconds / self.kernel_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio}
