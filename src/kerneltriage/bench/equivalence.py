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
from kerneltriage.bench.harness import GREEDY
from kerneltriage.bench.workloads import WORKLOAD_SEED, token_stream
from kerneltriage.engine.levers import LEVERS

DIGEST_PROMPTS = 2  # greedy digests: this many random prompts …
DIGEST_PROMPT_TOKENS = 16  # … of this many tokens …
DIGEST_TOKENS = 32  # … each continued by this many generated tokens
DIGEST_SEED = WORKLOAD_SEED + 1
# Levers that change the arithmetic, not only the schedule: other kernels (compile, a pinned SDPA backend,
# graphs' masked attention over a fixed window) or other GEMM shapes (packed projections), so rounding differs.
NUMERIC_LEVERS = frozenset(name for name in LEVERS
                           if name.startswith(("compile=", "sdpa_backend=")) or name in ("graphs", "packed_qkv",
                                                                                         "packed_gate_up", "fused_norm"))
# Allowed max |logit_B − logit_A| / max |logit_A| where digests may differ, per dtype: a few rounding steps
# of the dtype at the logits' scale (bf16 keeps 8 significant bits: one step is 0.4%), over all the layers.
LOGIT_RTOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Correctness:
    """Greedy digests of A and B; the max logit difference where they differ or may differ; the tolerance
    (None: equal digests are required)."""

    digest_a: str
    digest_b: str
    max_logit_diff: float | None = None  # relative to max |logit of A|
    tolerance: float | None = None

    @property
    def passed(self) -> bool:
        if self.digest_a == self.digest_b:
            return True
        return self.tolerance is not None and self.max_logit_diff is not None and self.max_logit_diff <= self.tolerance

    @property
    def detail(self) -> str:
        same = "equal" if self.digest_a == self.digest_b else "differ"
        text = f"greedy digests {same} over {DIGEST_PROMPTS} prompts × {DIGEST_TOKENS} tokens"
        if self.max_logit_diff is not None:
            text += f"; max |Δlogit| {self.max_logit_diff:.1e} of the logit scale"
        rule = "equal digests required" if self.tolerance is None else f"tolerance {self.tolerance:.0e}"
        return f"{text} ({rule})"


def token_digest(runner: Runner, prompts: Sequence[Sequence[int]]) -> str:
    """sha256 of the greedy continuations of `prompts` through the runner's own prefill and token loop."""
    ids = [list(generate_step(runner, prompt, GREEDY, DIGEST_TOKENS)) for prompt in prompts]
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def max_logit_diff(a: Runner, b: Runner, prompts: Sequence[Sequence[int]]) -> float:
    """max |logit_B − logit_A| / max |logit_A| over a prefill and DIGEST_TOKENS − 1 decode steps per
    prompt, both fed A's greedy tokens (teacher forcing: one flipped near-tie does not derail the rest)."""
    worst = scale = 0.0
    for prompt in prompts:
        tokens = torch.tensor([list(prompt)], device=a.device)  # (1, T)
        for runner in (a, b):
            runner.reset_cache(len(prompt) + DIGEST_TOKENS)
        la, lb = a.prefill(a.model, tokens, 0), b.prefill(b.model, tokens, 0)  # (1, V)
        for position in range(len(prompt), len(prompt) + DIGEST_TOKENS):
            worst = max(worst, (la.float() - lb.float()).abs().max().item())
            scale = max(scale, la.float().abs().max().item())
            if position + 1 < len(prompt) + DIGEST_TOKENS:
                token = la.argmax(-1).view(1, 1)
                la, lb = a.decode(a.model, token, position), b.decode(b.model, token, position)
    return worst / scale


@torch.inference_mode()
def check_outputs(a: Runner, b: Runner) -> Correctness:
    """Correctness before speed. Equal digests pass. Otherwise a tolerance on the logits decides, but only
    where differences are expected: a lever that changes the arithmetic, or random weights (their near-flat
    logits make greedy ties common, and the tokens are noise anyway); elsewhere differing digests fail."""
    stream = token_stream(a.config.vocab_size, DIGEST_PROMPTS * DIGEST_PROMPT_TOKENS, DIGEST_SEED)
    prompts = [stream[i:i + DIGEST_PROMPT_TOKENS] for i in range(0, len(stream), DIGEST_PROMPT_TOKENS)]
    digests = token_digest(a, prompts), token_digest(b, prompts)
    tolerant = a.config.random_weights or bool(NUMERIC_LEVERS & {*a.levers, *b.levers})
    tolerance = LOGIT_RTOL[a.dtype] if tolerant else None
    if digests[0] == digests[1] and not tolerant:
        return Correctness(*digests)
    return Correctness(*digests, max_logit_diff(a, b, prompts), tolerance)
