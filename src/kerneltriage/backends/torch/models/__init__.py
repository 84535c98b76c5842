"""PyTorch's models: the file each architecture record of `engine/architectures.py` names (`Architecture.model`:
llama.py builds llama, qwen2 and qwen3; gemma3.py Gemma-3); `model_class` picks one by `ModelConfig.arch`."""

from __future__ import annotations

from kerneltriage.backends.torch.models.llama import Model
from kerneltriage.engine.architectures import model_classes

MODELS: dict[str, type[Model]] = model_classes(__name__)


def model_class(arch: str) -> type[Model]:
    """The Model class of an architecture (ModelConfig validates `arch` against engine/architectures.py)."""
    return MODELS[arch]


__all__ = ["MODELS", "Model", "model_class"]
