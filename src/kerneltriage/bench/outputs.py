"""What a check reads of a runner: its greedy digest through its own loop, its teacher-forced logits, a stock
runner's greedy continuation verified in causal forwards — and `Outputs`, which keeps them for the next check against
the same runner (triage's climb checks each winner of a round against one base).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Sequence, TypeVar

import numpy as np

from kerneltriage.bench.harness import GREEDY
from kerneltriage.engine.backend import Runner
from kerneltriage.engine.generation import generate_step

T = TypeVar("T")


class Outputs:
    """A runner's outputs already computed in this process — its greedy digest and its teacher-forced rows — kept for
    the next check against the same runner (triage's climb checks each winner against one base). They are a
    deterministic function of the weights, the configuration, the dtype and the tokens, which the key names. A
    float32 reference's rows are kept by the checkpoint they upcast and the dtype they were upcast from, and only for
    a runner holding the stock copy's values (every stock copy of one checkpoint then upcasts to the same model)."""

    def __init__(self) -> None:
        self.kept: dict[tuple, object] = {}

    def get(self, runner: Runner, what: tuple, make: Callable[[], T]) -> T:
        key = (id(runner.checkpoint), runner.run_config.text, runner.dtype, *what)
        if key not in self.kept:
            self.kept[key] = make()
        return self.kept[key]  # type: ignore[return-value]

    def fed(self, prompts: Sequence[Sequence[int]], count: int, tokens: Sequence[Sequence[int]]
            ) -> list[list[int]]:
        """The tokens a check teacher-forces after `prompts`: the first A's greedy continuation these prompts were
        checked with (in a climb, the start's), `tokens` the first time. Every later check then forces the same
        positions, so stock's float32 rows over them are computed once."""
        key = ("fed", frozen(prompts), count)
        if key not in self.kept:
            self.kept[key] = [list(t) for t in tokens]
        return self.kept[key]  # type: ignore[return-value]

    def reference(self, runner: Runner, levers: str, what: tuple, make: Callable[[], T]) -> T:
        """Rows of `runner`'s weights upcast to float32 under `levers` (a configuration's text; `make` builds them),
        kept for any runner of the same checkpoint and dtype whose weights hold the stock values: a climb's winner's
        rows are the next round's reference (the levers both sides share)."""
        if not runner.run_config.stock_values:
            return make()
        key = (id(runner.checkpoint), "float32", levers, runner.dtype, *what)
        if key not in self.kept:
            self.kept[key] = make()
        return self.kept[key]  # type: ignore[return-value]


def frozen(rows: Sequence[Sequence[int]]) -> tuple:
    return tuple(tuple(r) for r in rows)


def token_digest(runner: Runner, prompts: Sequence[Sequence[int]], tokens: int, kept: Outputs | None = None
                 ) -> tuple[str, list[list[int]]]:
    """sha256 of the greedy continuations of `prompts` through the runner's own prefill and token loop, and the
    continuations."""
    def make() -> tuple[str, list[list[int]]]:
        ids = [list(generate_step(runner, prompt, GREEDY, tokens)) for prompt in prompts]
        return hashlib.sha256(json.dumps(ids).encode()).hexdigest(), ids

    return make() if kept is None else kept.get(runner, ("digest", frozen(prompts), tokens), make)


def forced_rows(runner: Runner, prompts: Sequence[Sequence[int]], count: int,
                fed: Sequence[Sequence[int]] | None = None, kept: Outputs | None = None
                ) -> tuple[np.ndarray, list[list[int]]]:
    """All prompts' teacher-forced logits stacked (prompts × count, V), and the tokens fed (None: its own)."""
    def make() -> tuple[np.ndarray, list[list[int]]]:
        rows, tokens = [], []
        for i, prompt in enumerate(prompts):
            logits, given = runner.forced_logits(prompt, None if fed is None else fed[i], count)
            rows.append(logits)
            tokens.append(given)
        return np.concatenate(rows), tokens

    if kept is None:
        return make()
    return kept.get(runner, ("forced", frozen(prompts), count, None if fed is None else frozen(fed)), make)


def digests(a: Runner, b: Runner, prompts: Sequence[Sequence[int]], count: int, kept: Outputs | None
             ) -> tuple[tuple[str, list[list[int]]], tuple[str, list[list[int]]]]:
    """Both sides' digests and the tokens a check forces. Where A is stock and B computes another arithmetic (the
    logits decide, not the tokens), A's greedy continuation is verified over B's tokens in causal forwards
    (`verified_greedy`) instead of being decoded a token at a time — a climb's stock start is eager, and 300 eager
    steps cost seconds — and only as far as the first token where A disagrees: past it, A's own continuation would
    take a forward a token (the digests differ there already), so its tokens are A's up to and including that one
    and B's after it (a fixed sequence for the logits to be forced on). Not under a constraint: the forced rows'
    argmax is unconstrained, where the token loop samples through the constraint's mask."""
    if a.run_config.levers or a.speculation is not None or not b.run_config.changes_numerics \
            or a.checkpoint.grammar is not None:
        return token_digest(a, prompts, count, kept), token_digest(b, prompts, count, kept)
    theirs = token_digest(b, prompts, count, kept)

    def make() -> tuple[str, list[list[int]]]:
        own = [verified_greedy(a, prompt, count, draft, until_disagreement=True)
               for prompt, draft in zip(prompts, theirs[1])]
        fed = [mine + list(draft[len(mine):count]) for mine, draft in zip(own, theirs[1])]
        return hashlib.sha256(json.dumps(own).encode()).hexdigest(), fed

    ours = make() if kept is None else kept.get(a, ("verified", frozen(prompts), count, frozen(theirs[1])), make)
    return ours, theirs


def verified_greedy(runner: Runner, prompt: Sequence[int], count: int, draft: Sequence[int],
                    until_disagreement: bool = False) -> list[int]:
    """`count` greedy tokens of a stock runner after `prompt`, verified in causal forwards over `draft` (speculative
    verification: each forward accepts the draft up to its first disagreement and adds the runner's own token there).
    The same function as its token loop, computed at once (forced_logits takes one forward for a stock runner).
    `until_disagreement`: stop at the first token where the runner disagrees with the draft (that token included)."""
    tokens: list[int] = []
    guess = list(draft[: count - 1])
    while len(tokens) < count:
        fed = tokens + guess[len(tokens):]
        rows, _ = runner.forced_logits(prompt, fed, len(fed) + 1)
        for i in range(len(tokens), len(fed) + 1):
            tokens.append(int(rows[i].argmax()))
            if len(tokens) == count or (i < len(fed) and tokens[-1] != fed[i]):
                guess = tokens[:]  # past a disagreement the draft says nothing
                break
        at = len(tokens) - 1  # the last token taken: where a disagreement stopped this forward
        if until_disagreement and len(tokens) < count and at < len(draft) and tokens[at] != draft[at]:
            return tokens
    return tokens
