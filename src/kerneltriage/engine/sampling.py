"""Sampling parameters: what the user asked for, validated once; the backends implement them on device. And the
framework-free half of a backend's sampler: its logits processors, applied in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

# (token history (N,), logits (1, V)) → logits: a backend array in, the same backend's array out
LogitsProcessor = Callable[[Any, Any], Any]


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


class ProcessedSampler:
    """What every backend's sampler does alike: the generation's parameters and prompt, its logits processors (the
    ones given, then the repetition penalty where asked, `penalty(value)` being the backend's processor), applied in
    order. The backend adds the token history on the device, the draw and speculative acceptance."""

    def __init__(self, params: SamplingParams, prompt: list[int], processors: Sequence[LogitsProcessor],
                 penalty: Callable[[float], LogitsProcessor]) -> None:
        self.params, self.prompt = params, prompt
        self.processors = list(processors)
        if params.repetition_penalty != 1.0:
            self.processors.append(penalty(params.repetition_penalty))
        # the processors whose state is on the host (a constraint): the loops tell them each token (`follow`)
        self.followers = [p for p in self.processors if hasattr(p, "follow")]
        self.host_bound = bool(self.followers)  # read once per token by the loops: a plain attribute

    def follow(self, token: int) -> None:
        """A token this generation emitted, read on the host: the host-side processors commit it."""
        for processor in self.followers:
            processor.follow(token)

    def rows(self, limit: int) -> Any:
        """The ids a constraint allows next when at most `limit` (a step may compute only those rows), else None."""
        constraint = next((p for p in self.processors if hasattr(p, "rows")), None)
        return None if constraint is None else constraint.rows(limit)

    @property
    def argmax_only(self) -> bool:
        """Sampling is the argmax of the raw logits (greedy, no processors): what a resident step accepts."""
        return self.params.greedy and not self.processors

    def process(self, tokens: Any, logits: Any) -> Any:
        """Every processor over `tokens` (the history the row follows), in order: logits (1, V) → (1, V)."""
        for processor in self.processors:
            logits = processor(tokens, logits)
        return logits
