"""Quality metrics for levers that approximate (sparse attention, quantized weights): a lever that is not meant
to compute the stock function declares the metric that judges it — `top1>=0.99` (the share of teacher-forced
positions whose argmax agrees with stock) or `kl<=0.01` (the mean KL divergence, in nats, of its next-token
distribution from stock's) — instead of a logit tolerance. Numpy only: logits arrive on the host."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

QUALITY = re.compile(r"^(top1|kl)(>=|<=)([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)$")
DIRECTIONS = {"top1": ">=", "kl": "<="}  # agreement must reach a floor; divergence must stay under a ceiling


@dataclass(frozen=True)
class Quality:
    """A declared metric, how it is compared, and its bound."""

    metric: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> "Quality":
        """`top1>=0.99` or `kl<=0.01`; anything else (or the wrong direction) is a ValueError."""
        match = QUALITY.match(text.replace(" ", ""))
        if not match or DIRECTIONS[match.group(1)] != match.group(2):
            raise ValueError(f"quality {text!r}: expected top1>=FRACTION or kl<=NATS")
        return cls(match.group(1), float(match.group(3)))

    @property
    def text(self) -> str:
        return f"{self.metric}{DIRECTIONS[self.metric]}{self.bound:g}"

    def measure(self, reference: np.ndarray, rows: np.ndarray) -> float:
        """The metric of `rows` (positions, V) against the stock `reference` logits at the same positions."""
        if self.metric == "top1":
            return float(np.mean(reference.argmax(-1) == rows.argmax(-1)))
        return float(np.mean(np.sum(_softmax(reference) * (_log_softmax(reference) - _log_softmax(rows)), -1)))

    def holds(self, value: float) -> bool:
        return value >= self.bound if self.metric == "top1" else value <= self.bound


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _softmax(x: np.ndarray) -> np.ndarray:
    return np.exp(_log_softmax(x))
