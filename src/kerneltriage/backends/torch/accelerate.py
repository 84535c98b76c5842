"""Torch implementations of the levers named in `engine/levers.py`, each applied to a Runner from outside."""

from __future__ import annotations

from typing import Callable

import torch

from kerneltriage.backends.torch.models.llama import Model
from kerneltriage.backends.torch.runner import Runner


def _last_logits_prefill(model: Model, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """Output projection for the last prompt position only: (1, T, hidden) → (1, hidden) → (1, V)."""
    return model.logits(model.hidden(tokens, start)[:, -1])


def last_logits(runner: Runner) -> None:
    runner.prefill = _last_logits_prefill


APPLY: dict[str, Callable[[Runner], None]] = {"last_logits": last_logits}


def apply_levers(runner: Runner, names: tuple[str, ...]) -> Runner:
    """Apply each named lever in order; the runner remembers which are on."""
    for name in names:
        APPLY[name](runner)
    runner.levers = runner.levers + names
    return runner
