"""What every weight source hands the backends: config, raw tensors under internal names, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kerneltriage.engine.config import ModelConfig

if TYPE_CHECKING:
    from kerneltriage.engine.tokenizer import Tokenizer

FLOAT_TYPES = ("F32", "F16", "BF16")


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

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at their stored precision."""
        return sum(t.nbytes for t in self.tensors.values())
