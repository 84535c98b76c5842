"""Read a Hugging Face model folder: config.json plus `*.safetensors` shards, tensors under internal names.

Tensors are zero-copy views of a memmap of each shard, located by the safetensors header (8-byte little-endian
length + JSON). The `safetensors` package can't hand numpy a bfloat16 tensor and copies what it returns, and
the header is all we need to memmap every dtype the same way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.architectures import HF_MODEL_TYPES
from kerneltriage.engine.checkpoint import RawTensor

INDEX_NAME = "model.safetensors.index.json"
# BF16 has no numpy dtype: it travels as its uint16 bit patterns.
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_HEADER_LEN_BYTES = 8


def read_safetensors_dir(path: Path) -> tuple[dict[str, Any], dict[str, RawTensor]]:
    """(config.json as a dict, tensors under internal names) for a folder; raises InputError on bad input."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"model folder {path}: not found")
    if not path.is_dir():
        raise InputError(f"model folder {path}: not a folder; expected one with config.json and *.safetensors")
    config = _read_json(path / "config.json", "config.json")
    if not isinstance(config, dict):
        raise InputError(f"{path / 'config.json'}: expected a JSON object")
    weight_map = _weight_map(path / INDEX_NAME)
    headers = {shard.name: _read_header(shard) for shard in _shard_paths(path, weight_map)}
    if weight_map is not None:
        _check_index(path / INDEX_NAME, weight_map, headers)
    tensors: dict[str, RawTensor] = {}
    model_type = config.get("model_type")  # an unknown one is ModelConfig.from_hf's error
    record = HF_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    for shard_name, (header, data_start) in headers.items():
        _check_no_overlap(path / shard_name, header)
        mm = np.memmap(path / shard_name, dtype=np.uint8, mode="r")
        for name, entry in header.items():
            internal = names.to_internal(name, names.HF, record.name if record else "")
            if internal is not None:
                tensors[internal] = _tensor(path / shard_name, name, entry, mm, data_start)
    return config, tensors


def _read_json(file: Path, what: str) -> Any:
    if not file.is_file():
        raise InputError(f"{file}: not found; expected the model's {what}")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{file}: not readable JSON ({exc})") from None


def _weight_map(index_file: Path) -> dict[str, str] | None:
    """The index's tensor name → shard file map; None for a single-shard folder without an index."""
    if not index_file.is_file():
        return None
    index = _read_json(index_file, INDEX_NAME)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise InputError(f"{index_file}: expected a 'weight_map' object of tensor name → shard file")
    return weight_map


def _shard_paths(path: Path, weight_map: dict[str, str] | None) -> list[Path]:
    """The shards the index names, else every *.safetensors file (folders may hold other formats' files too)."""
    if weight_map is not None:
        shards = [path / name for name in sorted(set(weight_map.values()))]
        for shard in shards:
            if not shard.is_file():
                raise InputError(f"{path / INDEX_NAME}: names shard {shard.name}, which is not in the folder")
        return shards
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise InputError(f"model folder {path}: no *.safetensors files; expected the model weights")
    return shards


def _check_index(index_file: Path, weight_map: dict[str, str], headers: dict[str, tuple[dict[str, Any], int]]) -> None:
    """Every tensor the index names must be in the shard it names."""
    for name, shard in weight_map.items():
        if name not in headers[shard][0]:
            raise InputError(f"{index_file}: tensor {name!r} should be in {shard}, which does not hold it")


def _read_header(shard: Path) -> tuple[dict[str, Any], int]:
    """(tensor entries without `__metadata__`, byte offset where tensor data starts)."""
    size = shard.stat().st_size
    with shard.open("rb") as f:
        prefix = f.read(_HEADER_LEN_BYTES)
        header_len = int.from_bytes(prefix, "little") if len(prefix) == _HEADER_LEN_BYTES else -1
        if not 0 < header_len <= size - _HEADER_LEN_BYTES:
            raise InputError(f"{shard}: not a safetensors file (header length {header_len}, file size {size})")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as exc:
            raise InputError(f"{shard}: corrupt safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise InputError(f"{shard}: corrupt safetensors header (expected a JSON object)")
    header.pop("__metadata__", None)
    return header, _HEADER_LEN_BYTES + header_len


def _check_no_overlap(shard: Path, header: dict[str, Any]) -> None:
    """No two tensors share bytes (each one's own span is checked against its shape in `_tensor`)."""
    spans = []
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
            spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, name), (begin, _, other) in zip(spans, spans[1:]):
        if begin < end:
            raise InputError(f"{shard}: tensors {name!r} and {other!r} overlap (bytes {begin}..{end} of the data)")


def _tensor(shard: Path, name: str, entry: dict[str, Any], mm: np.ndarray, data_start: int) -> RawTensor:
    """A zero-copy typed view of one tensor, checked against its dtype and the shard's length."""
    dtype = entry.get("dtype") if isinstance(entry, dict) else None
    if dtype not in _DTYPES:
        raise InputError(f"{shard}: tensor {name!r} has dtype {dtype}; supported: {', '.join(_DTYPES)}")
    try:
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (data_start + int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{shard}: corrupt safetensors header entry for {name!r} ({exc!r})") from None
    if any(d < 0 for d in shape):
        raise InputError(f"{shard}: tensor {name!r} has a negative dimension in its shape {shape}")
    expected = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if begin < data_start or end > mm.size or end - begin != expected:
        raise InputError(
            f"{shard}: tensor {name!r} bytes {begin}..{end} don't fit its shape {shape} or the file of {mm.size} bytes"
        )
    return RawTensor(qtype=dtype, shape=shape, data=mm[begin:end].view(_DTYPES[dtype]).reshape(shape))
