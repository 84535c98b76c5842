"""Quality metrics for levers that approximate (sparse attention, quantized weights): a lever that is not meant
to compute the stock function declares the metrics that judge it, instead of a logit tolerance — one or several,
comma-separated, each against stock on the same tokens:

- `top1>=0.99`: the share of teacher-forced positions whose argmax agrees with stock;
- `kl<=0.01`: the mean KL divergence, in nats, of its next-token distribution from stock's;
- `maxlogit<=0.5`: the largest absolute difference of any logit at any teacher-forced position;
- `ppl<=1.01`: its perplexity over the tokens fed divided by stock's (exp of the mean next-token NLL difference);
- `greedy>=0.9`: the share of a free-running greedy continuation (GREEDY_TOKENS long) equal to stock's before the
  first token that differs (after that the two texts are unrelated, so later agreement says nothing).

Numpy only: logits arrive on the host."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

QUALITY = re.compile(r"^(top1|kl|maxlogit|ppl|greedy)(>=|<=)([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)$")
# agreement must reach a floor; divergence must stay under a ceiling
DIRECTIONS = {"top1": ">=", "kl": "<=", "maxlogit": "<=", "ppl": "<=", "greedy": ">="}
FREE_RUNNING = ("greedy",)  # measured on two free-running continuations, not on teacher-forced logits
GREEDY_TOKENS = 512  # the length of the greedy continuation `greedy` compares


@dataclass(frozen=True)
class Compared:
    """What the metrics read: stock's and the lever's teacher-forced logits (positions, V) at the same positions;
    `targets` (positions,) the token fed after each position (-1: none, the last row of a prompt); `greedy` the two
    free-running continuations (stock's, the lever's)."""

    reference: np.ndarray
    rows: np.ndarray
    targets: np.ndarray | None = None
    greedy: tuple[Sequence[int], Sequence[int]] | None = None


@dataclass(frozen=True)
class Quality:
    """A declared metric, how it is compared, and its bound."""

    metric: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> "Quality":
        """`top1>=0.99`, `kl<=0.01`, `maxlogit<=0.5`, `ppl<=1.01` or `greedy>=0.9`; anything else (or the wrong
        direction) is a ValueError."""
        match = QUALITY.match(text.replace(" ", ""))
        if not match or DIRECTIONS[match.group(1)] != match.group(2):
            raise ValueError(f"quality {text!r}: expected top1>=FRACTION, kl<=NATS, maxlogit<=LOGITS, "
                             "ppl<=RATIO or greedy>=FRACTION")
        return cls(match.group(1), float(match.group(3)))

    @classmethod
    def parse_all(cls, text: str) -> tuple["Quality", ...]:
        """Comma-separated metrics, each as `parse` takes it; at least one."""
        parts = [part for part in text.split(",") if part.strip()]
        if not parts:
            raise ValueError(f"quality {text!r}: expected at least one metric")
        return tuple(cls.parse(part) for part in parts)

    @property
    def text(self) -> str:
        return f"{self.metric}{DIRECTIONS[self.metric]}{self.bound:g}"

    @property
    def free_running(self) -> bool:
        return self.metric in FREE_RUNNING

    def measure(self, reference: np.ndarray | Compared, rows: np.ndarray | None = None) -> float:
        """The metric of the lever's outputs against stock's: a `Compared`, or (reference, rows) logits alone."""
        seen = reference if isinstance(reference, Compared) else Compared(reference, rows)  # type: ignore[arg-type]
        if self.metric == "greedy":
            if seen.greedy is None:
                raise ValueError("quality greedy: needs two greedy continuations")
            return agreement(*seen.greedy)
        ref, out = seen.reference, seen.rows
        if self.metric == "top1":
            return float(np.mean(ref.argmax(-1) == out.argmax(-1)))
        if self.metric == "maxlogit":
            return float(np.max(np.abs(out - ref)))
        if self.metric == "ppl":
            if seen.targets is None:
                raise ValueError("quality ppl: needs the tokens fed")
            return perplexity_ratio(ref, out, seen.targets)
        return float(np.mean(np.sum(_softmax(ref) * (_log_softmax(ref) - _log_softmax(out)), -1)))

    def holds(self, value: float) -> bool:
        return value >= self.bound if DIRECTIONS[self.metric] == ">=" else value <= self.bound


def perplexity_ratio(reference: np.ndarray, rows: np.ndarray, targets: np.ndarray) -> float:
    """exp(mean NLL of the lever − mean NLL of stock) over the positions with a target: its perplexity ÷ stock's."""
    keep = targets >= 0
    if not keep.any():
        raise ValueError("quality ppl: no position has a target")
    picked = targets[keep][:, None]

    def nll(logits: np.ndarray) -> float:
        return float(-np.mean(np.take_along_axis(_log_softmax(logits[keep]), picked, -1)))

    return float(np.exp(nll(rows) - nll(reference)))


def agreement(stock: Sequence[int], lever: Sequence[int]) -> float:
    """The share of stock's greedy tokens the lever's continuation matches before its first differing token."""
    if not stock:
        raise ValueError("quality greedy: an empty continuation")
    same = next((i for i, (x, y) in enumerate(zip(stock, lever)) if x != y), min(len(stock), len(lever)))
    return same / len(stock)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _softmax(x: np.ndarray) -> np.ndarray:
    return np.exp(_log_softmax(x))
