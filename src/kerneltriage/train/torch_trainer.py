"""The torch backend's trainer (`Trainer` in train/__init__.py): drafts by self-distillation (distill.py) and
EAGLE-style heads (eagle.py), on torch runners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kerneltriage.backends.torch import eagle as heads
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.config import ModelConfig
from kerneltriage.train import Progress
from kerneltriage.train import distill as drafts
from kerneltriage.train.eagle import HeadReport
from kerneltriage.train.eagle import train_head as _train_head


def check_student(target: Checkpoint, layers: int) -> None:
    drafts.student_checkpoint(target, layers)


def distill(target: Runner, layers: int, steps: int, continuation: int, progress: Progress
            ) -> tuple[Runner, drafts.DistillReport]:
    return drafts.distill(target, layers, steps, continuation, progress)


def save_draft(student: Runner, folder: Path) -> None:
    drafts.save_folder(student, folder)


def train_head(target: Runner, steps: int, continuation: int, samples: int, progress: Progress
               ) -> tuple[Any, HeadReport]:
    return _train_head(target, steps, continuation, samples, progress=progress)


def save_head(head: Any, path: Path) -> None:
    heads.save_head(head, path)


def head_path(config: ModelConfig) -> Path:
    return heads.default_path(config)
