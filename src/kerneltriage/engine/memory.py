"""How much memory a model will need, from its sizes alone, before anything is allocated.

weights (every parameter in the run dtype) + a KV cache (2 · layers · kv_heads · positions · head_dim
elements) + what loading holds beside them at once (the largest weight, dequantized in float32 on its way in).
Activations and logits depend on the run's prompt length and are left to the run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kerneltriage.core.errors import InputError
from kerneltriage.core.roofline import DTYPE_BYTES  # noqa: F401 - re-exported: the --dtype check reads it here
from kerneltriage.core.units import format_bytes
from kerneltriage.engine.checkpoint import BLOCK_TYPES, Checkpoint
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.names import PROJECTIONS
from kerneltriage.engine.validate import expected_shapes

# KV positions assumed when the run's own context is not known yet: the default pp512 + tg128 workloads
# and chat turns fit; a longer run allocates its cache later, and fails there if it does not fit.
ESTIMATE_CONTEXT = 4096
FLOAT32_BYTES = 4
# The --dtype names every backend accepts and the dtype each stands for (its bytes per element: DTYPE_BYTES).
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a model needs on its device, by part."""

    weights: int
    kv_cache: int
    transient: int
    positions: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.transient

    def describe(self) -> str:
        """'34.3 GB (weights 32.1 GB + KV cache for 4,096 positions 2.15 GB + 2.10 GB while loading)'."""
        return (f"{format_bytes(self.total)} (weights {format_bytes(self.weights)} + KV cache for "
                f"{self.positions:,} positions {format_bytes(self.kv_cache)} + {format_bytes(self.transient)} "
                f"while loading)")


def estimate_memory(config: ModelConfig, dtype_bytes: int, positions: int | None = None) -> MemoryEstimate:
    """The estimate for `config` in a dtype of `dtype_bytes` per element, its cache holding `positions`
    (default: the model's context, at most ESTIMATE_CONTEXT)."""
    if dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes={dtype_bytes}: expected a positive byte count")
    positions = min(config.max_context, ESTIMATE_CONTEXT) if positions is None else positions
    sizes = [math.prod(shape) for shape in expected_shapes(config).values()]
    kv = 2 * config.num_layers * config.num_kv_heads * positions * config.head_dim * dtype_bytes
    return MemoryEstimate(sum(sizes) * dtype_bytes, kv, max(sizes) * FLOAT32_BYTES, positions)


def require_fits(config: ModelConfig, dtype: str, dtype_bytes: int, device: str, available: int | None,
                 saved: int = 0) -> None:
    """InputError when `config` in `dtype` cannot fit in the `available` bytes of `device` (unknown: no check);
    `saved`: bytes the weights take less than in `dtype` (those kept as quantized blocks)."""
    estimate = estimate_memory(config, dtype_bytes)
    if saved:
        estimate = dataclasses.replace(estimate, weights=estimate.weights - saved)
    if available is not None and estimate.total > available:
        raise InputError(f"{config.name or 'the model'} in {dtype} needs about {estimate.describe()} on {device}, "
                         f"but {format_bytes(available)} is available; try --dtype bf16, a smaller model or "
                         "another --device")


_MEMINFO = Path("/proc/meminfo")
# cgroup v2: a container's limit and use; "max" means no limit.
_CGROUP_MAX, _CGROUP_CURRENT = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")


def host_available_bytes() -> int | None:
    """Memory a new allocation can take on this machine: MemAvailable, capped by a container's cgroup limit;
    None where neither can be read (not Linux)."""
    available = None
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = _CGROUP_MAX.read_text().strip()
        if limit != "max":
            room = int(limit) - int(_CGROUP_CURRENT.read_text())
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


def stored_blocks(checkpoint: Checkpoint, dtype_bytes: int) -> tuple[int, int]:
    """Bytes of the layers' projections and the output head (a tied one: the embedding) stored as BLOCK_TYPES
    blocks, and of their values at `dtype_bytes` each: what the `quantized` lever keeps, and what it saves."""
    tensors = checkpoint.tensors
    head = "lm_head" if "lm_head" in tensors else "embed" if checkpoint.config.tie_embeddings else None
    kept = [raw for name, raw in tensors.items() if raw.qtype in BLOCK_TYPES and len(raw.shape) == 2
            and (name == head or (name.startswith("layers.") and name.rsplit(".", 1)[-1] in PROJECTIONS))]
    return (sum(np.asarray(raw.data).nbytes for raw in kept),
            sum(math.prod(raw.shape) for raw in kept) * dtype_bytes)
