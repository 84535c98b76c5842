"""Tiny MLX runners for the MLX tests: the conftest's tiny models (float32 weights), and the same models with their
matrices stored as GGUF Q4_0/Q4_1/Q8_0 blocks (llama.cpp's own quantizer), so `quantized` has blocks to keep."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from conftest import tiny_checkpoint
from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
from kerneltriage.engine.configuration import RunConfig

MATRICES = ("embed", "lm_head", "q", "k", "v", "o", "gate", "up", "down")


def quantized_checkpoint(arch: str = "llama", projections: str = "Q4_1", embed: str = "Q8_0",
                         **changes: object) -> Checkpoint:
    """The tiny `arch` model with every matrix quantized: projections (and an untied head) as `projections`, the
    embedding as `embed`; norms and biases stay float32."""
    checkpoint = tiny_checkpoint(arch, **changes)
    tensors = {}
    for name, raw in checkpoint.tensors.items():
        kind = name.rsplit(".", 1)[-1]
        qtype = embed if kind == "embed" else projections if kind in MATRICES else None
        if qtype is None:
            tensors[name] = raw
        else:
            blocks = quantize(np.asarray(raw.data, dtype=np.float32), GGMLQuantizationType[qtype])  # (rows, bytes)
            tensors[name] = RawTensor(qtype, raw.shape, blocks)
    return replace(checkpoint, tensors=tensors)


def mlx_runner(checkpoint: Checkpoint, levers: str = "", dtype: str = "float32", spec: str | None = None,
               depth: str | None = None):  # noqa: ANN201 - an MLX Runner
    """An MLX runner on the CPU with `levers` (an --levers string) and speculation applied."""
    from kerneltriage.backends.mlx.backend import BACKEND

    return BACKEND.build(checkpoint, RunConfig.from_flags(levers, spec, depth), "cpu", dtype)
