"""Training drafters for speculative decoding by self-distillation: a draft model (the target's first layers,
`distill.py`) and an EAGLE-style head (`eagle.py`). Training runs on a backend's runners and needs its autograd, so
a backend that can train names its trainer (`Backend.trainer`: the module here that implements `Trainer`); the
command asks for it through `get_trainer` and never imports a backend itself.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend import get_backend

if TYPE_CHECKING:
    from kerneltriage.engine.backend import Runner
    from kerneltriage.engine.checkpoint import Checkpoint
    from kerneltriage.engine.config import ModelConfig

Progress = Callable[[str], None]


class Trainer(Protocol):
    """What `kerneltriage distill` asks of a backend's trainer (a module of this package)."""

    def check_student(self, target: "Checkpoint", layers: int) -> None:
        """An InputError when a draft of `layers` layers cannot be cut from or written for `target`."""

    def distill(self, target: "Runner", layers: int, steps: int, continuation: int, progress: Progress
                ) -> tuple["Runner", Any]:
        """A draft model trained on the target's answers: its runner and the training report."""

    def save_draft(self, student: "Runner", folder: Path) -> None:
        """The draft as a Hugging Face folder that `--spec draft:PATH` loads."""

    def train_head(self, target: "Runner", steps: int, continuation: int, samples: int, progress: Progress
                   ) -> tuple[Any, Any]:
        """An EAGLE-style head trained on the target's hidden states: the head and the training report."""

    def save_head(self, head: Any, path: Path) -> None:
        """The head as a file that `--spec eagle:PATH` loads."""

    def head_path(self, config: "ModelConfig") -> Path:
        """Where a model's head is written by default, and where `--spec eagle` looks for it."""


def get_trainer(backend_name: str) -> Trainer:
    """The trainer of the backend `backend_name` names; an InputError where that backend cannot train."""
    backend = get_backend(backend_name)
    module = getattr(backend, "trainer", None)
    if module is None:
        raise InputError(f"--backend {backend.name}: it cannot train drafters; expected a backend that can "
                         f"(--backend torch)")
    return importlib.import_module(module)  # type: ignore[return-value] - a module implementing Trainer
