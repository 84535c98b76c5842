"""What every weight source hands the backends: config, raw tensors under internal names, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import numpy as np

from kerneltriage.core.errors import InputError
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.names import param_name

if TYPE_CHECKING:
    from kerneltriage.engine.grammar import Grammar
    from kerneltriage.engine.tokenizer import Tokenizer

FLOAT_TYPES = ("F32", "F16", "BF16")
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # the block types the `quantized` lever keeps as they are, on every backend


@dataclass(frozen=True)
class RawTensor:
    """One stored tensor before dequantization.

    `shape` is the logical shape in PyTorch order (out, in). `data` is a typed array of that shape for
    float types (BF16 as uint16 bit patterns), and for quantized types the raw block bytes as uint8 of
    shape (rows, bytes_per_row), rows = product of all but the last logical dimension.
    """

    qtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class Checkpoint:
    """A model ready for a backend to build: shapes, stored tensors, tokenizer, where it came from."""

    config: ModelConfig
    tensors: dict[str, RawTensor]
    tokenizer: "Tokenizer"
    source: str
    chat_template: str | None = None
    meta: dict[str, object] = field(default_factory=dict)
    # the workload's output constraint, compiled for this tokenizer (engine/constraint.py says why it rides here):
    # every runner built from the checkpoint samples under it; None: free text
    grammar: "Grammar | None" = None

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at their stored precision."""
        return sum(t.nbytes for t in self.tensors.values())

    def by_parameter(self, expected: Mapping[str, tuple[int, ...]]) -> dict[str, RawTensor]:
        """The stored tensors under the backend Model's parameter paths, each checked against the parameter it fills
        (`expected`: path → shape, a tied output head left out): a tensor with no place, one of another shape or a
        parameter left unfilled is an InputError naming it, before anything is copied."""
        placed = {}
        for internal, raw in self.tensors.items():
            name = param_name(internal, self.config.arch)
            if name is None:
                continue
            if name not in expected and internal == "lm_head" and self.config.tie_embeddings:
                continue  # a tied checkpoint that stores its head anyway (engine/validate.py): the embedding is it
            if name not in expected:
                raise InputError(f"{self.source}: tensor {internal} has no place in a {self.config.arch} model")
            if tuple(raw.shape) != tuple(expected[name]):
                raise InputError(f"{self.source}: {internal} has shape {raw.shape}, expected {tuple(expected[name])}")
            placed[name] = raw
        missing = sorted(set(expected) - set(placed))
        if missing:
            raise InputError(f"{self.source}: missing tensors for {', '.join(missing[:4])}")
        return placed
