"""Levers that approximate (numerics "approximates" in the lever table) are judged by the quality metrics they
declare (engine/quality.py), never by a logit tolerance, and on real text: the passage every backend's sparsity probe
reads (engine/passage.py), teacher-forced over its whole length, and its greedy continuation of GREEDY_TOKENS. Real
text, because what such a lever drops depends on what the model attends to.

The metrics compare the lever with "the exact path": in float32, B against A. In bf16 or fp16 the two sides' own
rounding differs by more than any metric could bound (a flipped near-tie ends greedy agreement; logits move by tenths),
so the metrics judge B's configuration rebuilt in float32 against stock float32 on B's weights — the approximation and
nothing else — and B's precision is held to ab's usual bound (no further from float32 than REFERENCE_FACTOR × A).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kerneltriage.bench.harness import GREEDY
from kerneltriage.bench.outputs import Outputs, digests, forced_rows
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.quality import GREEDY_TOKENS, Compared, Quality
from kerneltriage.engine.sparsity import passage_tokens

Judged = dict[str, tuple[float, bool]]  # declared metric → (value, holds)


def declared_quality(runner: Runner) -> list[Quality]:
    """The metrics the runner's approximating levers declare (a lever declares them exactly when it approximates:
    levers.Lever checks it) and its approximating kernels (engine/kernels.Kernel.quality), each once."""
    texts = [s.lever.quality for s in runner.run_config.levers if s.lever.quality is not None]
    texts += runner.approximations
    found = {q.text: q for text in texts for q in Quality.parse_all(text)}
    return list(found.values())


def _targets(fed: Sequence[Sequence[int]], count: int) -> np.ndarray:
    """(prompts × count,) the token fed after each teacher-forced row; -1 after a prompt's last row."""
    return np.concatenate([np.array(list(tokens)[: count - 1] + [-1] * (count - min(len(tokens), count - 1)))
                           for tokens in fed])


def judge_quality(a: Runner, b: Runner, prompts: Sequence[Sequence[int]], count: int,
                  fed: Sequence[Sequence[int]], greedy: tuple[Sequence[int], Sequence[int]] | None = None) -> Judged:
    """Each approximating lever's declared metrics: B's teacher-forced logits against A's on the tokens `fed`, and
    `greedy`, the two sides' free-running continuations (None: GREEDY_TOKENS of each after the first prompt)."""
    declared = declared_quality(b)
    if not declared:
        return {}
    (ref, given), (rows, _) = forced_rows(a, prompts, count, fed), forced_rows(b, prompts, count, fed)
    if greedy is None and any(q.free_running for q in declared):
        greedy = greedy_runs(a, b, prompts[0])
    seen = Compared(ref, rows, _targets(given, count), greedy)
    return {q.text: (value, q.holds(value)) for q in declared for value in [q.measure(seen)]}


def greedy_runs(a: Runner, b: Runner, prompt: Sequence[int]) -> tuple[list[int], list[int]]:
    """GREEDY_TOKENS greedy tokens of each side after `prompt` (as many as the context allows)."""
    count = min(GREEDY_TOKENS, a.config.max_context - len(prompt) - 1)
    return list(generate_step(a, prompt, GREEDY, count)), list(generate_step(b, prompt, GREEDY, count))


def passage(runner: Runner) -> tuple[list[int], int]:
    """The passage in the runner's tokens (at most half its context) and the greedy tokens that follow it."""
    text = passage_tokens(runner)[: runner.config.max_context // 2]
    return text, min(GREEDY_TOKENS, runner.config.max_context - len(text) - 1)


def on_passage(a: Runner, b: Runner, greedy: tuple[Sequence[int], Sequence[int]] | None = None) -> Judged:
    """The declared metrics of B against A over the passage (`greedy`: the continuations already made, if any)."""
    text, _ = passage(a)
    return judge_quality(a, b, [text[:1]], len(text), [text[1:]], greedy)


def in_float32(backend: Backend, b: Runner) -> Judged:
    """The declared metrics of B's configuration in float32 against stock float32 on B's weights, over the passage:
    the approximation alone, without the rounding of B's dtype. The two copies are released after."""
    stock = backend.float32_reference(b, None)
    try:
        lever = backend.float32_reference(b, b.run_config)
        try:
            return on_passage(stock, lever)
        finally:
            backend.release(lever)
    finally:
        backend.release(stock)


def passage_digests(a: Runner, b: Runner, kept: Outputs | None = None
                    ) -> tuple[tuple[str, list[list[int]]], tuple[str, list[list[int]]], int]:
    """Both sides' greedy continuations of the passage (their digests), and their length."""
    text, count = passage(a)
    first, second = digests(a, b, [text], count, kept)
    return first, second, count
