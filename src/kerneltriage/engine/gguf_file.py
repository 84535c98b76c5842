"""Read a GGUF file: all metadata as plain Python values, tensors as zero-copy views of a memmap.

The header is parsed by `gguf_header` (every count bounded by the file's length) and the tensor table checked
against the file's bytes (`validate.check_layout`) before any tensor is mapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.checkpoint import RawTensor
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.gguf_header import MAGIC, TensorInfo, read_header
from kerneltriage.engine.validate import check_layout

SUPPORTED_QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

# BF16 has no numpy dtype: it travels as its uint16 bit patterns.
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
# Which head count the llama converter permuted each Q/K tensor with.
_PERMUTED_HEADS = {"q": "num_heads", "q_bias": "num_heads", "k": "num_kv_heads", "k_bias": "num_kv_heads"}


@dataclass
class GGUFContents:
    """Everything in one GGUF file: key/value metadata and tensors under their GGUF names."""

    meta: dict[str, Any]
    tensors: dict[str, RawTensor]


def read_gguf(path: Path) -> GGUFContents:
    """Read a GGUF file's metadata and memmap its tensors; raises InputError on a bad file."""
    path = Path(path)
    _check_magic(path)
    header = read_header(path)
    check_layout(str(path), header.tensors, header.data_offset, header.alignment, header.file_size)
    return GGUFContents(meta=header.meta, tensors=_map_tensors(path, header.tensors))


def gguf_to_internal(contents: GGUFContents, config: ModelConfig) -> dict[str, RawTensor]:
    """Rename tensors to internal names (dropping ones we don't use), undo llama's Q/K permutation and take back
    the offset llama.cpp's converter added to Gemma's norm weights (internal ones are HF's)."""
    out: dict[str, RawTensor] = {}
    offset = config.architecture.norm_offset
    for name, raw in contents.tensors.items():
        internal = names.to_internal(name, names.GGUF)
        if internal is None:
            continue
        if offset and internal.endswith("norm"):
            raw = _unshifted(name, raw, offset)
        heads_attr = _PERMUTED_HEADS.get(internal.split(".", 2)[-1])
        # Only architectures llama.cpp rotates in adjacent pairs were permuted; NeoX ones are stored as in HF.
        if config.architecture.gguf_permuted_qk and heads_attr is not None:
            raw = RawTensor(raw.qtype, raw.shape, names.gguf_unpermute_rows(raw.data, getattr(config, heads_attr)))
        out[internal] = raw
    return out


def _unshifted(name: str, raw: RawTensor, offset: float) -> RawTensor:
    """A norm's weight w from the stored offset + w (float32, as transformers' reader takes it back)."""
    if raw.qtype not in _FLOAT_DTYPES or raw.qtype == "BF16":
        raise InputError(f"tensor {name!r}: a norm weight of type {raw.qtype}; expected F32 or F16")
    return RawTensor("F32", raw.shape, raw.data.astype(np.float32) - np.float32(offset))


def _check_magic(path: Path) -> None:
    if not path.exists():
        raise InputError(f"model file {path}: not found")
    if not path.is_file():
        raise InputError(f"model file {path}: is not a file; expected a .gguf file")
    try:
        with path.open("rb") as f:
            magic = f.read(len(MAGIC))
    except OSError as exc:
        raise InputError(f"model file {path}: cannot be read ({exc.strerror})") from None
    if magic != MAGIC:
        raise InputError(f"{path}: not a GGUF file (magic {magic!r}; expected 'GGUF')")


def _map_tensors(path: Path, table: tuple[TensorInfo, ...]) -> dict[str, RawTensor]:
    """Zero-copy views of each tensor's bytes (the table is already checked against the file's length)."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    tensors: dict[str, RawTensor] = {}
    for info in table:
        if info.qtype not in SUPPORTED_QTYPES:
            raise InputError(
                f"{path}: tensor {info.name!r} has type {info.qtype}; supported types: {', '.join(SUPPORTED_QTYPES)}"
            )
        data = _typed_view(mm[info.offset:info.offset + info.nbytes], info.qtype, info.shape)
        tensors[info.name] = RawTensor(qtype=info.qtype, shape=info.shape, data=data)
    return tensors


def _typed_view(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Float types as typed arrays of the logical shape; quantized ones as (rows, bytes_per_row) uint8."""
    if qtype in _FLOAT_DTYPES:
        return raw.view(_FLOAT_DTYPES[qtype]).reshape(shape)
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]  # rows are whole blocks (gguf_header)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    # (rows, blocks_per_row * bytes_per_block)
    return raw.reshape(rows, shape[-1] // block_size * type_size)
