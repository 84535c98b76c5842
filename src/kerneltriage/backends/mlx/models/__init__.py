"""The architecture registry: one model file per architecture of `engine/architectures.py` (tests/test_architectures.py
checks it against the records), the class chosen by `ModelConfig.arch`."""

from __future__ import annotations

from kerneltriage.backends.mlx.models import gemma3, llama, qwen2, qwen3
from kerneltriage.backends.mlx.models.llama import Model

MODELS: dict[str, type[Model]] = {"llama": llama.Model, "qwen2": qwen2.Model, "qwen3": qwen3.Model,
                                  "gemma3": gemma3.Model}


def model_class(arch: str) -> type[Model]:
    """The Model class of an architecture (ModelConfig validates `arch` against engine/architectures.py)."""
    return MODELS[arch]


__all__ = ["MODELS", "Model", "model_class"]
