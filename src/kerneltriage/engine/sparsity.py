"""How much of the attention weight is ~0: the ceiling for sparse-V (skip V rows nobody attends to), measured the
same way on every backend.

Measured on a real prompt with real weights (random weights attend uniformly, so a preset says nothing): during one
prefill, each layer's softmax(q·kᵀ/√D) is recomputed for the last query rows, the ones that see the deepest
context, and the weights below a threshold counted among the keys each query may see. A backend supplies that
count over its arrays (`BelowFn`); the prefill and its bookkeeping are here.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from kerneltriage.engine.passage import PASSAGE
from kerneltriage.engine.probes import Sparsity

SPARSE_THRESHOLD = 1e-6
QUERY_ROWS = 16  # the last prompt positions: the queries with the most keys to skip
# (q (B, H, T, D), k (B, Hkv, S, D), the queries' first position, threshold) → (weights below it, weights counted,
# V rows below it for every query head of their KV head, V rows counted) over the last QUERY_ROWS queries
BelowFn = Callable[[Any, Any, int, float], tuple[int, int, int, int]]


def attention_sparsity(runner: Any, tokens: Sequence[int], below: BelowFn,
                       threshold: float = SPARSE_THRESHOLD) -> Sparsity:
    """Prefill `tokens` with each layer's attention weights inspected on the way."""
    model, inner = runner.model, runner.model.attention
    counts: list[tuple[int, int, int, int]] = []

    def inspecting(q: Any, k: Any, v: Any, pos: Any, **kwargs: Any) -> Any:
        counts.append(below(q, k, pos.start or 0, threshold))
        return inner(q, k, v, pos, **kwargs)

    runner.reset_cache(len(tokens))
    model.attention = inspecting
    try:
        runner.prefill(tokens, 0)
        runner.synchronize()  # (a lazy backend's prefill has run every layer's count already: it read them)
    finally:
        model.attention = inner
    small, total, rows_small, rows_total = (sum(column) for column in zip(*counts))
    return Sparsity(len(tokens), threshold, small / total, tuple(c[0] / c[1] for c in counts), rows_small / rows_total)


def passage_tokens(runner: Any) -> list[int]:
    """The passage in the model's own tokens, cut to fit its context."""
    return runner.checkpoint.tokenizer.encode(PASSAGE)[: runner.config.max_context]


def on_stock_copy(backend: Any, runner: Any, probe: Callable[[Any, Sequence[int]], Sparsity]) -> Sparsity:
    """`probe` (a backend's attention_sparsity) over the passage, on a stock copy of `runner`, released after: the
    probe reads each layer's weights back to the host, which a captured prefill (prefill_graphs) forbids — the H200
    raised "operation not permitted when stream is capturing"."""
    from kerneltriage.engine.configuration import RunConfig

    stock = backend.copy(runner, RunConfig())
    try:
        return probe(stock, passage_tokens(stock))
    finally:
        backend.release(stock)
