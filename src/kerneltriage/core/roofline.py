"""Roofline arithmetic: the least time a test can take on a device, from the model's shapes alone.

Standard library only. A test's floor is max(bytes that must move / copy bandwidth, FLOPs that must be
computed / matmul peak): decode is bandwidth-bound (every weight is read once per token), prefill of a
long prompt compute-bound. Measured time ≥ floor, so `percent_of_roofline` ≤ 100 unless the ceilings
are wrong.

What counts as "must", and why:
- weights: every parameter a token touches, read once per forward pass. The bytes are those the engine
  holds: the torch engine dequantizes to its run dtype (params × dtype size), llama.cpp reads its
  quantized blocks (stored bytes). The output projection is read in full for every decode token; tied
  embeddings share that matrix, so it counts once; an untied embedding table costs one row per token.
- KV cache: a token at context c reads c cached positions × 2 (K and V) × layers × kv_heads × head_dim.
- FLOPs: 2 per multiply-add of every matmul weight, plus attention: QKᵀ and PV each 2·heads·head_dim
  per query per key, i.e. 4·L·H·D·c for a query at context c; causal prefill counts only the lower
  triangle. The output projection counts for the LAST prompt position only: logits nobody reads are
  deletable work (question 1), so they are not part of the floor. Norms, RoPE, activations: omitted
  (elementwise, < 1% of the FLOPs at these shapes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

# Bytes per element of each run dtype name (torch's names with the "torch." prefix dropped).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MEMORY_BOUND, COMPUTE_BOUND = "memory", "compute"


class ModelShape(Protocol):
    """The ModelConfig fields the arithmetic reads (engine.config.ModelConfig, frozen, satisfies it: read-only)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def intermediate_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def tie_embeddings(self) -> bool: ...

    @property
    def attention_bias(self) -> bool: ...

    @property
    def qk_norm(self) -> bool: ...

    @property
    def norms_per_layer(self) -> int: ...

    @property
    def sliding_window(self) -> int | None: ...

    @property
    def sliding_layers(self) -> int: ...


@dataclass(frozen=True)
class Ceilings:
    """What the device can do: copy bandwidth (bytes read + written per second) and matmul FLOP/s."""

    bandwidth: float
    matmul_flops: float
    source: str  # "measured" or "datasheet"
    device: str = ""
    dtype: str = ""

    def __post_init__(self) -> None:
        for name in ("bandwidth", "matmul_flops"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"ceilings: {name} must be a positive number, got {value}")


def best_ceilings(first: Ceilings, *others: Ceilings) -> Ceilings:
    """The device's ceilings as the best any framework measured on it: one whose copy or matmul is slower (MLX's
    Linux CPU build links the reference BLAS) did not reach the device's peak, and a peer's rate against it would
    pass 100%."""
    found = (first, *others)
    if len(found) == 1:
        return first
    sources = {c.source for c in found}
    return Ceilings(max(c.bandwidth for c in found), max(c.matmul_flops for c in found),
                    sources.pop() if len(sources) == 1 else "measured+datasheet", first.device, first.dtype)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by role. `layer_matmul` are the linear weights of one block (no biases or norms)."""

    embedding: int
    output: int  # 0 when tied to the embedding
    layer: int  # everything in one block
    layer_matmul: int
    final_norm: int
    layers: int

    @property
    def total(self) -> int:
        """Every stored parameter (tied matrices once)."""
        return self.embedding + self.output + self.layer * self.layers + self.final_norm


@dataclass(frozen=True)
class Cost:
    """Work of one test: bytes that must move and FLOPs that must be computed."""

    bytes: float
    flops: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.flops + other.flops)


@dataclass(frozen=True)
class Floor:
    """The least time a test can take, and which ceiling sets it."""

    seconds: float
    bound: str  # MEMORY_BOUND or COMPUTE_BOUND


def param_counts(config: ModelShape) -> ParamCounts:
    """Parameters of a Llama-family model (llama, qwen2 with q/k/v biases, qwen3 with q/k norms, gemma3 with both
    those and two more norms a layer)."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    attention = h * q + 2 * h * kv + q * h  # q, k, v, o projections
    mlp = 3 * h * config.intermediate_size  # gate, up, down
    extras = config.norms_per_layer * h  # two RMSNorms (Gemma-3: four)
    extras += (q + 2 * kv) if config.attention_bias else 0
    extras += 2 * config.head_dim if config.qk_norm else 0
    matrix = config.vocab_size * h
    return ParamCounts(
        embedding=matrix,
        output=0 if config.tie_embeddings else matrix,
        layer=attention + mlp + extras,
        layer_matmul=attention + mlp,
        final_norm=h,
        layers=config.num_layers,
    )


def params_read_per_token(config: ModelShape) -> int:
    """Parameters one forward pass reads: all blocks, the final norm, the output matrix in full and —
    when the embedding is a separate table — the one row looked up."""
    counts = param_counts(config)
    embedding_row = 0 if config.tie_embeddings else config.hidden_size
    output_matrix = config.vocab_size * config.hidden_size
    return counts.layer * counts.layers + counts.final_norm + output_matrix + embedding_row


def engine_weight_bytes(config: ModelShape, dtype_bytes: int) -> int:
    """Weight bytes one forward pass reads when the engine holds every weight at `dtype_bytes` per
    parameter (the torch engine and HF: GGUF blocks are dequantized to the run dtype at load)."""
    return params_read_per_token(config) * dtype_bytes


def kv_bytes(config: ModelShape, positions: float, dtype_bytes: int) -> float:
    """Bytes of K and V for `positions` cached positions: 2 × layers × kv_heads × head_dim × positions × size."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * positions * dtype_bytes


def layer_contexts(config: ModelShape, depth: int, tokens: int) -> float:
    """Σ over layers and over the rows i = 1..tokens after `depth` cached positions of the positions row i attends,
    depth + i, capped at the window in sliding layers (Gemma-3: five in six): the (query, key) pairs of a pass."""
    full = tokens * depth + tokens * (tokens + 1) / 2
    window, sliding = config.sliding_window, config.sliding_layers
    if window is None or not sliding:
        return config.num_layers * full
    below = min(max(window - depth - 1, 0), tokens)  # rows whose depth + i is under the window
    capped = below * depth + below * (below + 1) / 2 + (tokens - below) * window
    return (config.num_layers - sliding) * full + sliding * capped


def _attention_flops(config: ModelShape, layer_pairs: float) -> float:
    """QKᵀ and PV: 2 FLOPs per multiply-add, heads × head_dim each, per (query, key) pair of each layer."""
    return 4 * config.num_heads * config.head_dim * layer_pairs


def _matmul_flops(config: ModelShape, tokens: int, output_rows: int) -> float:
    counts = param_counts(config)
    return 2.0 * (counts.layer_matmul * counts.layers * tokens + config.vocab_size * config.hidden_size * output_rows)


def decode_cost(config: ModelShape, tokens: int, depth: int, weight_bytes: float, kv_dtype_bytes: int) -> Cost:
    """`tokens` decode steps after `depth` cached positions: step i (0-based) runs at context depth + i + 1
    (it reads every earlier position and its own; a sliding layer the last `sliding_window` of them). Each step
    reads all weights once."""
    if tokens < 1 or depth < 0:
        raise ValueError(f"decode cost: expected tokens ≥ 1 and depth ≥ 0, got {tokens}, {depth}")
    contexts = layer_contexts(config, depth, tokens)  # Σ_layers Σ_{i=1..tokens} (depth + i), windows capped
    moved = tokens * weight_bytes + 2 * config.num_kv_heads * config.head_dim * contexts * kv_dtype_bytes  # K and V
    return Cost(moved, _matmul_flops(config, tokens, tokens) + _attention_flops(config, contexts))


def prefill_cost(config: ModelShape, tokens: int, depth: int, weight_bytes: float, kv_dtype_bytes: int) -> Cost:
    """A prompt of `tokens` after `depth` cached positions, in one pass: weights read once, the cached
    positions read and the new ones written once; causal attention pairs Σ_{i=1..tokens} (depth + i);
    the output projection for the last position only."""
    if tokens < 1 or depth < 0:
        raise ValueError(f"prefill cost: expected tokens ≥ 1 and depth ≥ 0, got {tokens}, {depth}")
    pairs = layer_contexts(config, depth, tokens)
    moved = weight_bytes + kv_bytes(config, depth + tokens, kv_dtype_bytes)
    return Cost(moved, _matmul_flops(config, tokens, 1) + _attention_flops(config, pairs))


def floor(cost: Cost, ceilings: Ceilings) -> Floor:
    """The roofline time of `cost`: the slower of moving its bytes and computing its FLOPs."""
    memory, compute = cost.bytes / ceilings.bandwidth, cost.flops / ceilings.matmul_flops
    return Floor(memory, MEMORY_BOUND) if memory >= compute else Floor(compute, COMPUTE_BOUND)


def percent_of_roofline(measured_seconds: float, floor_seconds: float) -> float:
    """100 × floor / measured: how close a measured time comes to the device's limit."""
    if measured_seconds <= 0 or floor_seconds <= 0:
        raise ValueError(f"roofline: times must be positive, got {measured_seconds}, {floor_seconds}")
    return 100.0 * floor_seconds / measured_seconds
