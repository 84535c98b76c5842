"""Read a GGUF file: all metadata as plain Python values, tensors as zero-copy views of a memmap.

`gguf.GGUFReader` is the reference parser, but it takes seconds on a 49k-entry tokenizer array, so the first
read stores what it found (metadata + a tensor table) as JSON in the file's cache folder; later reads load
that JSON and memmap the file directly.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.checkpoint import RawTensor
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.paths import converted_dir

SUPPORTED_QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
INDEX_NAME = "gguf_index.json"
# Bump when the index layout changes; an index of another format is rebuilt.
INDEX_FORMAT = 1

_MAGIC = b"GGUF"
# BF16 has no numpy dtype: it travels as its uint16 bit patterns.
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
# Which head count the llama converter permuted each Q/K tensor with.
_PERMUTED_HEADS = {"q": "num_heads", "q_bias": "num_heads", "k": "num_kv_heads", "k_bias": "num_kv_heads"}
# What GGUFReader raises on a cut or garbled header (it indexes and reshapes short memmap slices).
_READER_ERRORS = (ValueError, IndexError, KeyError, OverflowError)


@dataclass
class GGUFContents:
    """Everything in one GGUF file: key/value metadata and tensors under their GGUF names."""

    meta: dict[str, Any]
    tensors: dict[str, RawTensor]


def read_gguf(path: Path) -> GGUFContents:
    """Read a GGUF file's metadata and memmap its tensors; raises InputError on a bad file."""
    path = Path(path)
    _check_magic(path)
    index_path = converted_dir(path) / INDEX_NAME
    index = _load_index(index_path)
    if index is None:
        index = _parse_with_reader(path)
        _save_index(index_path, index)
    return GGUFContents(meta=index["meta"], tensors=_map_tensors(path, index["tensors"]))


def gguf_to_internal(contents: GGUFContents, config: ModelConfig) -> dict[str, RawTensor]:
    """Rename tensors to internal names (dropping ones we don't use) and undo llama's Q/K permutation."""
    out: dict[str, RawTensor] = {}
    for name, raw in contents.tensors.items():
        internal = names.to_internal(name, names.GGUF)
        if internal is None:
            continue
        heads_attr = _PERMUTED_HEADS.get(internal.split(".", 2)[-1])
        # Only the `llama` converter permutes; qwen2/qwen3 use NeoX rope in llama.cpp and are stored as in HF.
        if config.arch == "llama" and heads_attr is not None:
            raw = RawTensor(raw.qtype, raw.shape, names.gguf_unpermute_rows(raw.data, getattr(config, heads_attr)))
        out[internal] = raw
    return out


def _check_magic(path: Path) -> None:
    if not path.exists():
        raise InputError(f"model file {path}: not found")
    if not path.is_file():
        raise InputError(f"model file {path}: is not a file; expected a .gguf file")
    with path.open("rb") as f:
        magic = f.read(len(_MAGIC))
    if magic != _MAGIC:
        raise InputError(f"{path}: not a GGUF file (magic {magic!r}; expected 'GGUF')")


def _parse_with_reader(path: Path) -> dict[str, Any]:
    """Parse with gguf.GGUFReader into the index form.

    {"format": INDEX_FORMAT, "meta": {key: value}, "tensors": [[name, qtype, shape, offset, nbytes], ...]}
    """
    try:
        reader = GGUFReader(path)
        # GGUF.* entries are the reader's own header fields (version, counts), not key/value metadata.
        meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    except _READER_ERRORS as exc:
        reason = " ".join(str(exc).split())  # the message must stay on one line
        raise InputError(f"{path}: truncated or corrupt GGUF file of {path.stat().st_size} bytes ({reason})") from None
    tensors = [
        # GGUF stores dims innermost first; the logical shape is PyTorch order (out, in).
        [t.name, t.tensor_type.name, [int(d) for d in reversed(t.shape.tolist())], int(t.data_offset), int(t.n_bytes)]
        for t in reader.tensors
    ]
    return {"format": INDEX_FORMAT, "meta": meta, "tensors": tensors}


def _load_index(index_path: Path) -> dict[str, Any] | None:
    """The cached index, or None when absent, unreadable or of another format (then it is rebuilt)."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        return None
    return index


def _save_index(index_path: Path, index: dict[str, Any]) -> None:
    """Write atomically (temp file + rename) so a concurrent or interrupted reader never sees half an index."""
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=index_path.parent, prefix=INDEX_NAME, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(index, f, ensure_ascii=False)
            os.replace(tmp, index_path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        # The index only saves time: an unwritable cache folder means the next read parses again, nothing worse.
        return


def _map_tensors(path: Path, table: list[list[Any]]) -> dict[str, RawTensor]:
    """Zero-copy views of each tensor's bytes, checked against the file's length and our supported types."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    tensors: dict[str, RawTensor] = {}
    for name, qtype, shape, offset, nbytes in table:
        if qtype not in SUPPORTED_QTYPES:
            raise InputError(
                f"{path}: tensor {name!r} has type {qtype}; supported types: {', '.join(SUPPORTED_QTYPES)}"
            )
        if offset + nbytes > mm.size:
            raise InputError(
                f"{path}: truncated: tensor {name!r} ends at byte {offset + nbytes} but the file has {mm.size} bytes"
            )
        data = _typed_view(path, name, mm[offset:offset + nbytes], qtype, tuple(shape))
        tensors[name] = RawTensor(qtype=qtype, shape=tuple(shape), data=data)
    return tensors


def _typed_view(path: Path, name: str, raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Float types as typed arrays of the logical shape; quantized ones as (rows, bytes_per_row) uint8."""
    if qtype in _FLOAT_DTYPES:
        return raw.view(_FLOAT_DTYPES[qtype]).reshape(shape)
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    if shape[-1] % block_size:
        raise InputError(
            f"{path}: tensor {name!r} row length {shape[-1]} is not a multiple of {qtype}'s block of {block_size}"
        )
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    # (rows, blocks_per_row * bytes_per_block)
    return raw.reshape(rows, shape[-1] // block_size * type_size)
