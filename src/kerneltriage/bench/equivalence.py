"""Correctness before speed: do two runners produce the same output? Greedy token digests over a few
random prompts; for levers that change numerics, also the max logit difference under a stated tolerance.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

import torch

from kerneltriage.backends.torch.generate import generate_step
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.backends.torch.speculative import decoder_of, padded_rows
from kerneltriage.bench.harness import GREEDY
from kerneltriage.bench.workloads import WORKLOAD_SEED, token_stream
from kerneltriage.engine.levers import LEVERS

DIGEST_PROMPTS = 2  # greedy digests: this many random prompts …
DIGEST_PROMPT_TOKENS = 16  # … of this many tokens …
DIGEST_TOKENS = 32  # … each continued by this many generated tokens
DIGEST_SEED = WORKLOAD_SEED + 1
# Levers that change the arithmetic, not only the schedule: other kernels (compile, a pinned SDPA backend,
# FlexAttention, graphs' masked attention over a fixed window) or other GEMM shapes (packed projections).
NUMERIC_LEVERS = frozenset(name for name in LEVERS if name.startswith(("compile=", "sdpa_"))
                           or name in ("graphs", "packed_qkv", "packed_gate_up", "fused_norm", "flex_decode"))
# Where digests may differ, how far B's logits may be from the arithmetic both sides approximate, relative to
# max |logit|. A float32 A is that arithmetic: B must stay within a few float32 rounding steps of it. A bf16 or
# fp16 A already carries its own rounding error; B is judged against a float32 copy of the same weights and may
# be at most REFERENCE_FACTOR times as far from it as A is (another rounding order lands about as far; a wrong
# result lands orders of magnitude further), and never needs to beat LOGIT_FLOOR.
LOGIT_RTOL = 1e-4  # float32 A: max |logit_B − logit_A| / max |logit_A|
REFERENCE_FACTOR = 2.0
LOGIT_FLOOR = 1e-3


@dataclass(frozen=True)
class Correctness:
    """Greedy digests of A and B and, where they differ or may differ, B's logit error and its bound
    (tolerance None: equal digests are required). `reference` says what B was compared with: "A" (a float32 A)
    or "float32" (a float32 copy of A's weights; then `error_a` is A's own error against it)."""

    digest_a: str
    digest_b: str
    max_logit_diff: float | None = None  # max |logit_B − logit_reference| / max |logit_reference|
    tolerance: float | None = None
    reference: str = "A"
    error_a: float | None = None

    @property
    def passed(self) -> bool:
        if self.digest_a == self.digest_b:
            return True
        return self.tolerance is not None and self.max_logit_diff is not None and self.max_logit_diff <= self.tolerance

    @property
    def detail(self) -> str:
        same = "equal" if self.digest_a == self.digest_b else "differ"
        text = f"greedy digests {same} over {DIGEST_PROMPTS} prompts × {DIGEST_TOKENS} tokens"
        if self.tolerance is None:
            return f"{text} (equal digests required)"
        if self.reference == "A":
            return f"{text}; max |Δlogit| {self.max_logit_diff:.1e} of the logit scale (tolerance {self.tolerance:.0e})"
        return (f"{text}; max |Δlogit| against float32: B {self.max_logit_diff:.1e}, A {self.error_a:.1e} of the "
                f"logit scale (tolerance {self.tolerance:.1e} = max({REFERENCE_FACTOR:g} × A's, {LOGIT_FLOOR:.0e}))")


def token_digest(runner: Runner, prompts: Sequence[Sequence[int]]) -> str:
    """sha256 of the greedy continuations of `prompts` through the runner's own prefill and token loop."""
    ids = [list(generate_step(runner, prompt, GREEDY, DIGEST_TOKENS)) for prompt in prompts]
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def logit_errors(reference: Runner, others: Sequence[Runner], prompts: Sequence[Sequence[int]]) -> list[float]:
    """max |logit_X − logit_reference| / max |logit_reference| for each runner X in `others`, over the prompt's
    last position and DIGEST_TOKENS − 1 generated ones, every runner fed the reference's greedy tokens (teacher
    forcing: one flipped near-tie does not derail the rest)."""
    worst, scale = [0.0] * len(others), 0.0
    for prompt in prompts:
        ref, tokens = forced_logits(reference, prompt)
        scale = max(scale, ref.abs().max().item())
        worst = [max(w, (ref - forced_logits(r, prompt, tokens)[0]).abs().max().item()) for w, r in zip(worst, others)]
    return [w / scale for w in worst]


def forced_logits(runner: Runner, prompt: Sequence[int], fed: Sequence[int] | None = None
                  ) -> tuple[torch.Tensor, list[int]]:
    """Float32 logits (DIGEST_TOKENS, V) after the prompt and after each of the tokens `fed` (None: the runner's
    own greedy tokens), and the tokens fed. A speculating runner takes them through its verify forward, its
    deepest k+1 rows at a time (padded like its own loop pads), so the path its speculation runs is the one
    checked; the others through their decode step."""
    runner.reset_cache(len(prompt) + DIGEST_TOKENS)
    rows = [runner.prefill(runner.model, torch.tensor([list(prompt)], device=runner.device), 0)[0].float()]
    position, fed = len(prompt), list(fed or [])[: DIGEST_TOKENS - 1]
    block = verify_rows(runner)
    if block and len(fed) < DIGEST_TOKENS - 1:
        raise ValueError("a speculating runner is checked on the reference's tokens: pass them")
    while len(rows) < DIGEST_TOKENS:
        done = len(rows) - 1  # tokens fed so far
        if block:
            chunk = fed[done:done + block]
            padded = padded_rows(torch.tensor(chunk, device=runner.device), block)  # (1, block)
            rows += list(runner.verify(runner.model, padded, position + done)[: len(chunk)].float())
            runner.model.cache.trim(position + done + len(chunk))
            continue
        if done == len(fed):  # no token given: the runner's own greedy one
            fed.append(int(rows[-1].argmax()))
        step = torch.tensor([[fed[done]]], device=runner.device)
        rows.append(runner.decode(runner.model, step, position + done)[0].float())
    return torch.stack(rows), fed


def verify_rows(runner: Runner) -> int:
    """Rows per verify forward when the runner speculates (its deepest k + 1), else 0."""
    decoder = decoder_of(runner)
    return decoder.controller.deepest + 1 if decoder else 0


def float32_reference(runner: Runner) -> Runner:
    """The same weights as `runner` (as it stores them), computed in float32 with the stock steps."""
    from kerneltriage.backends.torch.runner import build_runner

    reference = build_runner(runner.checkpoint, runner.device, runner.dtype)  # bit-identical weights …
    reference.model.float()  # … then exact upcasts: only the arithmetic differs
    reference.dtype = torch.float32
    return reference


@torch.inference_mode()
def check_outputs(a: Runner, b: Runner) -> Correctness:
    """Correctness before speed. Equal digests pass. Otherwise a tolerance on the logits decides, but only
    where differences are expected: a lever that changes the arithmetic, or random weights (their near-flat
    logits make greedy ties common, and the tokens are noise anyway); elsewhere differing digests fail."""
    stream = token_stream(a.config.vocab_size, DIGEST_PROMPTS * DIGEST_PROMPT_TOKENS, DIGEST_SEED)
    prompts = [stream[i:i + DIGEST_PROMPT_TOKENS] for i in range(0, len(stream), DIGEST_PROMPT_TOKENS)]
    digests = token_digest(a, prompts), token_digest(b, prompts)
    # Speculation verifies k+1 rows in one forward: other GEMM shapes, so other rounding, like a numeric lever.
    speculating = bool(verify_rows(a) or verify_rows(b))
    tolerant = a.config.random_weights or speculating or bool(NUMERIC_LEVERS & {*a.levers, *b.levers})
    if digests[0] == digests[1] and not tolerant:
        return Correctness(*digests)
    if a.dtype == torch.float32:
        return Correctness(*digests, logit_errors(a, [b], prompts)[0], LOGIT_RTOL if tolerant else None)
    reference = float32_reference(a)
    try:
        error_a, error_b = logit_errors(reference, [a, b], prompts)
    finally:
        del reference
    tolerance = max(REFERENCE_FACTOR * error_a, LOGIT_FLOOR) if tolerant else None
    return Correctness(*digests, error_b, tolerance, "float32", error_a)
