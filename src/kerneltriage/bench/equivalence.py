"""Correctness before speed: does B compute what A computes? Greedy token digests, a logit tolerance where the
arithmetic may differ, per-op checks at the model's real shapes, and the timed runs' own tokens.

- Digests: greedy continuations of random prompts through each runner's own prefill and token loop. Where what B
  changes against A acts on the decode path, it is checked over WINDOW_TOKENS generated tokens, past a graph window
  boundary (256 slots).
- Where digests may differ (a lever that reorders the arithmetic, speculation's verify of k+1 rows, random
  weights whose near-flat logits make greedy ties common), logits decide, teacher-forced on the reference's
  tokens over the same positions. The error is the relative L2 distance over every logit row,
  ‖X − R‖ / ‖R‖: a uniform 3% error in the logits is 3% whatever their spread, where a max-based error hides it
  under the largest logit. A float32 A is the reference: B within LOGIT_RTOL.
- A bf16/fp16 A carries its own rounding error (on the real default model 1.6–2.2% of the logits: as large as
  the errors to catch), so B is judged twice against a float32 copy R of A's weights. Semantics: B's very
  configuration rebuilt in float32 must land within LOGIT_RTOL of B's own weights in float32 under the levers A
  shares with B (stock float32 when A has none; B's weights are R unless B holds other values: `quantized` keeps the
  exact block values that A holds rounded) — any error in what B's own levers compute (a 1% scale as much as a 6%
  one) shows there, free of rounding, and what both sides share is not under test. Precision: B in its own dtype
  may be at most REFERENCE_FACTOR times as far from R as A is (another rounding order lands about as far; a kernel
  that accumulates in bf16 lands further; B's other weights, if worse, show here).
- Per-op checks: each seam a reordering lever replaces, against the stock op in float32 (backend.seam_errors),
  by the same factor.
- A lever that approximates (numerics "approximates" in the lever table) is not held to any of that: it is judged
  by the quality metrics it declares (engine/quality.py), on real text (bench/approximate.py); in bf16 those judge
  its configuration in float32, and B itself is held to the precision bound above; in float32 `ab` also judges them
  on the timed runs' own tokens at the run's depth.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from kerneltriage.bench import approximate
from kerneltriage.bench.outputs import Outputs, digests, forced_rows, frozen
from kerneltriage.bench.workloads import WORKLOAD_SEED, token_stream
from kerneltriage.engine.backend import Backend, Runner
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.levers import LeverSetting

DIGEST_PROMPTS = 2  # greedy digests: this many random prompts …
DIGEST_PROMPT_TOKENS = 16  # … of this many tokens …
DIGEST_TOKENS = 32  # … each continued by this many generated tokens
WINDOW_TOKENS = 300  # … or, with a lever on the decode path, one prompt continued past a 256-slot graph window
DIGEST_SEED = WORKLOAD_SEED + 1
LOGIT_RTOL = 1e-4  # float32 A: ‖B − A‖ / ‖A‖
REFERENCE_FACTOR = 1.5  # bf16/fp16: ‖B − R‖ ≤ 1.5 × ‖A − R‖ (R: float32 on the same weights) …
LOGIT_FLOOR = 1e-3  # … never asked to beat this
SEAM_FLOORS = {"float32": 1e-4}  # per-op checks: the error no op needs to beat, by dtype (else LOGIT_FLOOR)


@dataclass(frozen=True)
class Correctness:
    """Digests of A and B; where logits were compared, B's error, its bound and what it was compared with
    (`reference` "A": a float32 A; "float32": a float32 copy, `error_a` then A's own error); the per-op checks
    (seam → B's error, stock's error, bound); and what the timed runs' tokens showed (None: nothing wrong)."""

    digest_a: str
    digest_b: str
    tokens: int = DIGEST_TOKENS
    logit_error: float | None = None
    tolerance: float | None = None
    reference: str = "A"
    error_a: float | None = None
    semantic_error: float | None = None  # B's configuration in float32 against stock float32 on B's weights
    quality: dict[str, tuple[float, bool]] = field(default_factory=dict)  # declared metric → (value, holds)
    seams: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    timed: str | None = None
    checked: bool = True  # False: not compared, because the timing showed no win (`ab`'s winners-only check)
    seconds: float = 0.0  # what the check took
    parts: dict[str, float] = field(default_factory=dict)  # seconds of each part: digests, seams, logits

    @classmethod
    def unchecked(cls) -> "Correctness":
        """No comparison made: an A/B whose timing shows no win is not adopted, so its outputs need no check."""
        return cls("", "", 0, checked=False)

    @property
    def logits_pass(self) -> bool:
        if self.semantic_error is not None and self.semantic_error > LOGIT_RTOL:
            return False
        if self.digest_a == self.digest_b and (self.logit_error is None or self.tolerance is None):
            return True
        return self.tolerance is not None and self.logit_error is not None and self.logit_error <= self.tolerance

    @property
    def seam_failures(self) -> list[str]:
        return [f"{seam} {b:.1e} (stock {a:.1e}, bound {t:.1e})" for seam, (b, a, t) in self.seams.items() if b > t]

    @property
    def passed(self) -> bool:
        if not self.checked:
            return True  # nothing shown wrong; never a win (run_ab checks every timing that wins)
        if self.quality:  # an approximating lever: its declared metrics judge what it computes; its precision, in bf16
            precise = self.tolerance is None or (self.logit_error is not None and self.logit_error <= self.tolerance)
            return all(holds for _, holds in self.quality.values()) and precise and self.timed is None
        return self.logits_pass and not self.seam_failures and self.timed is None

    @property
    def detail(self) -> str:
        if not self.checked:
            return "outputs not checked: the timing showed no win (only winners are checked)"
        same = "equal" if self.digest_a == self.digest_b else "differ"
        parts = self._quality_parts(same) if self.quality else self._logit_parts(same)
        if self.timed is not None:
            parts.append(self.timed)
        return "; ".join(parts)

    def _logit_parts(self, same: str) -> list[str]:
        prompts = 1 if self.tokens == WINDOW_TOKENS else DIGEST_PROMPTS
        parts = [f"greedy digests {same} over {prompts} prompt(s) × {self.tokens} tokens"]
        if self.tolerance is None and self.logit_error is None:
            parts[0] += " (equal digests required)"
        elif self.reference == "A":
            parts.append(f"‖ΔB‖/‖A‖ {self.logit_error:.1e} (tolerance {self.tolerance or 0:.0e})")
        else:
            parts.append(f"against float32: B {self.logit_error:.1e}, A {self.error_a:.1e} (tolerance "
                         f"{self.tolerance or 0:.1e} = max({REFERENCE_FACTOR:g} × A's, {LOGIT_FLOOR:.0e})); "
                         f"B's levers in float32 {self.semantic_error:.1e} (tolerance {LOGIT_RTOL:.0e})")
        if self.seams:
            failed = self.seam_failures
            parts.append("per-op " + ("FAILED: " + "; ".join(failed) if failed else f"ok ({', '.join(self.seams)})"))
        return parts

    def _quality_parts(self, same: str) -> list[str]:
        """An approximating lever's: its declared metrics (in float32 where B is not) and, in bf16, B's precision."""
        where = "" if self.reference == "A" else " (B's levers in float32 against stock float32)"
        metrics = ", ".join(f"{name} = {value:.4g} ({'holds' if holds else 'FAILS'})"
                            for name, (value, holds) in self.quality.items())
        parts = [f"greedy continuations of the passage {same} over {self.tokens} tokens",
                 f"declared quality{where} {metrics}"]
        if self.tolerance is not None:
            parts.append(f"precision against float32: B {self.logit_error:.1e}, A {self.error_a:.1e} (tolerance "
                         f"{self.tolerance:.1e})")
        return parts


def relative_error(rows: np.ndarray, reference: np.ndarray) -> float:
    """‖rows − reference‖ / ‖reference‖ over every logit of every position."""
    return float(np.linalg.norm(rows - reference) / max(float(np.linalg.norm(reference)), 1e-30))


def _on_decode_path(setting: LeverSetting) -> bool:
    """A lever that acts on the decode step or loop (a step or loop lever of decode, or a decode-only one)."""
    lever = setting.lever
    return (lever.stage != "model" and "decode" in lever.phases) or lever.phases == ("decode",)


def _decode_path(a: Runner, b: Runner) -> bool:
    """What B changes against A (levers on one side only, or the speculation) acts on the decode step or loop: its
    check then runs past a graph window. What both sides share is not under test (a climb's base is graphed; a
    norm lever on top of it changes what the graph holds, not how windows are crossed)."""
    if a.run_config.speculation != b.run_config.speculation or (a.speculation is None) != (b.speculation is None):
        return True
    mine, theirs = set(a.run_config.levers), set(b.run_config.levers)
    return any(_on_decode_path(s) for s in mine ^ theirs)


def digest_prompts(a: Runner, b: Runner) -> tuple[list[list[int]], int]:
    """The prompts and generated tokens of the digest: WINDOW_TOKENS after one prompt where B changes the decode
    path against A and a side's cache attends over windows of slots (a static cache: graphs, MLX's compile), as far
    as the context allows; else DIGEST_TOKENS after each of DIGEST_PROMPTS prompts (a CPU's eager loop has no window
    to cross: 300 of its steps cost 20 s on 2 cores)."""
    stream = token_stream(a.config.vocab_size, DIGEST_PROMPTS * DIGEST_PROMPT_TOKENS, DIGEST_SEED)
    prompts = [stream[i:i + DIGEST_PROMPT_TOKENS] for i in range(0, len(stream), DIGEST_PROMPT_TOKENS)]
    windowed = any(getattr(getattr(r, "cache_type", None), "WINDOWED", False) for r in (a, b))
    if _decode_path(a, b) and windowed:
        return prompts[:1], min(WINDOW_TOKENS, a.config.max_context - DIGEST_PROMPT_TOKENS - 1)
    return prompts, DIGEST_TOKENS


def tolerant(a: Runner, b: Runner) -> bool:
    """Differing digests are judged on logits: random weights, or a side that computes another arithmetic."""
    return a.config.random_weights or a.run_config.changes_numerics or b.run_config.changes_numerics


def judge_logits(backend: Backend, a: Runner, b: Runner, prompts: Sequence[Sequence[int]], count: int,
                 allow: bool, fed: Sequence[Sequence[int]], kept: Outputs | None = None, semantic: bool = True
                 ) -> dict:
    """B's logit error and its bound (None when differences are not allowed: equal tokens are then required),
    teacher-forced on A's greedy tokens `fed` (one flipped near-tie does not derail the rest; with `kept`, those
    the first check of these prompts fed). Without `semantic` the float32 rebuild of B's configuration is skipped
    (a check on other tokens already judged it)."""
    if kept is not None:
        fed = kept.fed(prompts, count, fed)
    if a.dtype == "float32":
        ref = forced_rows(a, prompts, count, fed, kept)[0]
        error = relative_error(forced_rows(b, prompts, count, fed, kept)[0], ref)
        return {"logit_error": error, "tolerance": LOGIT_RTOL if allow else None}
    ref = _float32_rows(backend, a, None, prompts, count, fed, kept)  # an 8B one is 32 GB: one at a time
    error_a, error_b = (relative_error(forced_rows(r, prompts, count, fed, kept)[0], ref) for r in (a, b))
    # B's levers in float32 against B's own weights in float32 under the levers A shares with B (stock where A has
    # none): where B holds other values than A (quantized keeps the exact block values, A their bf16 roundings), A's
    # reference would charge that rounding to the lever; and what both sides share is not under test (MLX's CUDA
    # quantized matmul over several rows is 5e-4 off float32 itself, which would fail every A/B on top of it)
    semantic_error = relative_error(*(_float32_rows(backend, b, config, prompts, count, fed, kept)
                                      for config in (b.run_config, shared_levers(a, b)))) if semantic else None
    tolerance = max(REFERENCE_FACTOR * error_a, LOGIT_FLOOR) if allow else None
    return {"logit_error": error_b, "tolerance": tolerance, "reference": "float32", "error_a": error_a,
            "semantic_error": semantic_error}


def shared_levers(a: Runner, b: Runner) -> RunConfig | None:
    """The levers B has that A has too, in B's order, as the semantic check's reference (None: stock)."""
    shared = tuple(s for s in b.run_config.levers if s in a.run_config.levers)
    return RunConfig(shared) if shared else None


def _float32_rows(backend: Backend, runner: Runner, config: RunConfig | None, prompts: Sequence[Sequence[int]],
                  count: int, fed: Sequence[Sequence[int]], kept: Outputs | None = None) -> np.ndarray:
    """Forced logits of `runner`'s weights in float32 with `config`'s levers (None: stock), the model released after;
    kept in `kept` for the next check on the same weights (a climb checks each winner against the levers it shares
    with the round's base: the previous winner's rows)."""
    def make() -> np.ndarray:
        rebuilt = backend.float32_reference(runner, config)
        try:
            return forced_rows(rebuilt, prompts, count, fed)[0]
        finally:
            backend.release(rebuilt)

    if kept is None:
        return make()
    levers = "stock" if config is None else config.text
    return kept.reference(runner, levers, ("forced", frozen(prompts), count, frozen(fed)), make)


def seam_checks(backend: Backend, b: Runner) -> dict[str, tuple[float, float, float]]:
    """Per-op checks of B's reordering levers: seam → (B's error, stock's error, the bound)."""
    floor = SEAM_FLOORS.get(b.dtype, LOGIT_FLOOR)
    return {seam: (error_b, error_a, max(REFERENCE_FACTOR * error_a, floor))
            for seam, (error_b, error_a) in backend.seam_errors(b).items()}


def quality_outputs(backend: Backend, a: Runner, b: Runner, kept: Outputs | None = None) -> Correctness:
    """An approximating B (bench/approximate.py): its declared metrics over the passage and its greedy continuation —
    against A in float32; else B's configuration in float32 against stock float32, and B's precision by ab's bound."""
    (digest_a, tokens_a), (digest_b, tokens_b), count = approximate.passage_digests(a, b, kept)
    if a.dtype == "float32":
        quality = approximate.on_passage(a, b, (tokens_a[0], tokens_b[0]))
        return Correctness(digest_a, digest_b, count, quality=quality)
    quality = approximate.in_float32(backend, b)
    text, _ = approximate.passage(a)
    judged = judge_logits(backend, a, b, [text], count, True, tokens_a, kept, semantic=False)
    return Correctness(digest_a, digest_b, count, **judged, quality=quality)


def check_outputs(backend: Backend, a: Runner, b: Runner, kept: Outputs | None = None) -> Correctness:
    """Correctness before speed: digests, then logits where they may differ (or do), then the per-op checks — or,
    for a lever that approximates, its declared quality metric. `kept`: outputs computed by earlier checks, reused."""
    if approximate.declared_quality(b):
        return quality_outputs(backend, a, b, kept)
    parts: dict[str, float] = {}
    prompts, count = digest_prompts(a, b)
    with _timed(parts, "digests"):
        (digest_a, tokens_a), (digest_b, _) = digests(a, b, prompts, count, kept)
    with _timed(parts, "seams"):
        seams = seam_checks(backend, b)
    # Equal tokens settle it where neither side computes another arithmetic, or where what B changes against A is
    # exact (a graphed base plus a loop lever: the same kernels); elsewhere the logits must show it stays close
    # (equal greedy tokens can hide a small systematic error).
    numerics = a.run_config.changes_numerics or b.run_config.changes_numerics
    if digest_a == digest_b and (not numerics or exact_difference(a, b)):
        return Correctness(digest_a, digest_b, count, seams=seams, parts=parts)
    with _timed(parts, "logits"):
        judged = judge_logits(backend, a, b, prompts, count, tolerant(a, b), tokens_a, kept)
    return Correctness(digest_a, digest_b, count, **judged, seams=seams, parts=parts)


@contextmanager
def _timed(parts: dict[str, float], name: str) -> Iterator[None]:
    """Adds the seconds its block took to parts[name]."""
    began = time.perf_counter()
    try:
        yield
    finally:
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - began


def exact_difference(a: Runner, b: Runner) -> bool:
    """What B changes against A — levers on one side only; the same speculation on both — all keep the arithmetic."""
    if a.run_config.speculation != b.run_config.speculation:
        return False
    return all(s.lever.numerics == "exact" for s in set(a.run_config.levers) ^ set(b.run_config.levers))


def check_timed(backend: Backend, a: Runner, b: Runner, prefix: Sequence[int], tokens_a: Sequence[int],
                tokens_b: Sequence[int], semantic: bool = True, kept: Outputs | None = None) -> str | None:
    """The timed decode runs' own tokens: None when they agree, or when they differ within the logit bound
    (teacher-forced on the timed prefix); else what differs. Without `semantic`: B's configuration in float32 was
    judged already (by check_outputs), so only the precision bound is checked on these tokens."""
    if list(tokens_a) == list(tokens_b):
        return None
    first = next(i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y) if tokens_a else 0
    where = f"the timed runs' tokens differ from position {first} of {len(tokens_a)}"
    if not tolerant(a, b):
        return where
    if approximate.declared_quality(b):
        if a.dtype != "float32":  # its metrics were judged in float32 (quality_outputs): here B's precision only
            semantic = False
        else:
            quality = approximate.judge_quality(a, b, [list(prefix)], len(tokens_a), [list(tokens_a)],
                                                (tokens_a, tokens_b))
            failed = [f"{name} = {value:.4g}" for name, (value, holds) in quality.items() if not holds]
            return f"{where}, declared quality fails: {', '.join(failed)}" if failed else None
    judged = judge_logits(backend, a, b, [list(prefix)], len(tokens_a), True, [list(tokens_a)], kept, semantic)
    if judged["logit_error"] <= judged["tolerance"] and (judged.get("semantic_error") or 0.0) <= LOGIT_RTOL:
        return None
    return f"{where}, logits off by {judged['logit_error']:.1e} (bound {judged['tolerance']:.1e})"
