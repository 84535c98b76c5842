"""Sampling parameters: what the user asked for, validated once; the backends implement them on device."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0, top_p 1 and min_p 0 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0  # > 1 divides the logits of tokens already seen (1 = off), as in mlx-lm

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: expected >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: expected >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: expected in (0, 1]")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p={self.min_p}: expected in [0, 1)")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty}: expected > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
