"""Read a GGUF file's header — key/value metadata and the tensor table — checking every count and length
against the bytes left in the file before reading or allocating anything.

gguf-py's `GGUFReader` (the reference; tests check this reader against it) loops in Python once per array
element with no bound: one flipped byte in a value type or an array length sends it past the end of the file,
where its reads return empty slices and the loop never ends, its memory growing (four of 2,000 mutated files
hung that way). It also takes ~4 s on the default model's 49k-token vocabulary. Here a scalar array is one
numpy read, and a count is refused as soon as it cannot fit in what is left of the file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from kerneltriage.core.errors import InputError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# struct codes of the scalar value types (numpy reads arrays of them with the same codes).
_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
            GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
            GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
            GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
# The fewest bytes one metadata entry (key length + type + a 1-byte value) and one tensor entry
# (name length + dim count + type + offset) can take: a count needing more than the file holds is refused.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-table entry: logical shape in PyTorch order (outermost first), where its bytes are."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int  # absolute, from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """A parsed header. The `*_at` maps locate each entry in the file (the fuzz tests mutate them)."""

    version: int
    meta: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_size: int
    value_type_at: dict[str, int]  # metadata key → byte offset of its value-type field
    tensor_at: dict[str, int]  # tensor name → byte offset of its table entry


class _Corrupt(Exception):
    """Raised inside the parser; read_header turns it into one InputError naming the file."""


class _Cursor:
    """Reads little- or big-endian values from a buffer, never past its end."""

    def __init__(self, buf: Any, order: str) -> None:
        self.buf, self.pos, self.order, self.size = buf, 0, order, len(buf)

    def need(self, count: int, each: int, what: str) -> None:
        if count < 0 or count * each > self.size - self.pos:
            raise _Corrupt(f"{what} of {count} needs {count * each} bytes at offset {self.pos}, "
                           f"past the end of the file ({self.size} bytes)")

    def scalar(self, code: str, what: str) -> Any:
        size = struct.calcsize(code)
        self.need(1, size, what)
        value = struct.unpack_from(self.order + code, self.buf, self.pos)[0]
        self.pos += size
        return value

    def array(self, code: str, count: int, what: str) -> list[Any]:
        size = struct.calcsize(code)
        self.need(count, size, what)
        values = np.frombuffer(self.buf, np.dtype(self.order + code), count, self.pos).tolist()
        self.pos += count * size
        return values

    def string(self, what: str) -> str:
        length = self.scalar("Q", f"{what} length")
        self.need(length, 1, f"{what} string")
        raw = bytes(self.buf[self.pos:self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"{what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def read_header(path: Path) -> GGUFHeader:
    """Parse the header of the GGUF file at `path`; InputError (one line) on anything malformed."""
    with path.open("rb") as f:
        size = path.stat().st_size
        if size < len(MAGIC) + 4 + 16:
            raise InputError(f"{path}: truncated GGUF file of {size} bytes (the fixed header alone is 24)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(buf, size)
            except _Corrupt as exc:
                raise InputError(f"{path}: truncated or corrupt GGUF file of {size} bytes ({exc})") from None


def _parse(buf: Any, size: int) -> GGUFHeader:
    if bytes(buf[:4]) != MAGIC:
        raise _Corrupt(f"magic {bytes(buf[:4])!r}, expected {MAGIC!r}")
    # A file written on a big-endian machine reads as a version with zero low bits here.
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
    cursor = _Cursor(buf, order)
    cursor.pos = 4
    version = cursor.scalar("I", "version")
    if version not in SUPPORTED_VERSIONS:
        raise _Corrupt(f"version {version}; supported: {', '.join(map(str, SUPPORTED_VERSIONS))}")
    tensor_count, kv_count = cursor.scalar("Q", "tensor count"), cursor.scalar("Q", "metadata count")
    cursor.need(kv_count, _MIN_KV_BYTES, "metadata count")
    meta, value_type_at = _read_metadata(cursor, kv_count)
    cursor.need(tensor_count, _MIN_TENSOR_BYTES, "tensor count")
    entries = [_read_tensor_entry(cursor) for _ in range(tensor_count)]
    alignment = _alignment(meta)
    data_offset = -(-cursor.pos // alignment) * alignment
    tensors, tensor_at = _tensor_table(entries, data_offset)
    return GGUFHeader(version, meta, tensors, alignment, data_offset, size, value_type_at, tensor_at)


def _read_metadata(cursor: _Cursor, count: int) -> tuple[dict[str, Any], dict[str, int]]:
    meta: dict[str, Any] = {}
    type_at: dict[str, int] = {}
    for index in range(count):
        key = cursor.string(f"metadata key #{index}")
        if key in meta:
            raise _Corrupt(f"metadata key {key!r} appears twice")
        type_at[key] = cursor.pos
        meta[key] = _read_value(cursor, cursor.scalar("I", f"type of {key}"), key)
    return meta, type_at


def _value_type(raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise _Corrupt(f"metadata {key!r} has unknown value type {raw}") from None


def _read_value(cursor: _Cursor, raw_type: int, key: str) -> Any:
    kind = _value_type(raw_type, key)
    if kind == GGUFValueType.STRING:
        return cursor.string(key)
    if kind in _SCALARS:
        return cursor.scalar(_SCALARS[kind], key)
    item = _value_type(cursor.scalar("I", f"item type of {key}"), key)
    count = cursor.scalar("Q", f"length of {key}")
    if item in _SCALARS:
        return cursor.array(_SCALARS[item], count, f"array {key}")
    if item == GGUFValueType.STRING:
        cursor.need(count, 8, f"array {key}")  # every string has at least its 8-byte length
        return [cursor.string(f"{key}[{i}]") for i in range(count)]
    raise _Corrupt(f"metadata {key!r} is an array of arrays, which no supported model uses")


def _read_tensor_entry(cursor: _Cursor) -> tuple[int, str, list[int], int, int]:
    """(where the entry starts, name, GGUF dims innermost first, type id, offset relative to the data)."""
    start = cursor.pos
    name = cursor.string(f"tensor name at {start}")
    n_dims = cursor.scalar("I", f"dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions; expected 1 to {MAX_DIMS}")
    dims = cursor.array("Q", n_dims, f"dimensions of {name}")
    return start, name, dims, cursor.scalar("I", f"type of {name}"), cursor.scalar("Q", f"offset of {name}")


def _alignment(meta: dict[str, Any]) -> int:
    value = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise _Corrupt(f"general.alignment {value!r}: expected a positive power of two")
    return value


def _tensor_table(entries: list[tuple[int, str, list[int], int, int]],
                  data_offset: int) -> tuple[tuple[TensorInfo, ...], dict[str, int]]:
    """TensorInfo per entry: its type known, its row whole blocks, its byte count from its type's block size."""
    tensors, tensor_at = [], {}
    for start, name, dims, type_id, offset in entries:
        if name in tensor_at:
            raise _Corrupt(f"tensor {name!r} appears twice")
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise _Corrupt(f"tensor {name!r} has unknown type id {type_id}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if dims[0] % block or min(dims) < 1:
            raise _Corrupt(f"tensor {name!r} of shape {dims[::-1]}: rows of {dims[0]} are not whole "
                           f"{qtype.name} blocks of {block}")
        elements = int(np.prod(dims, dtype=object))
        tensors.append(TensorInfo(name, qtype.name, tuple(dims[::-1]), data_offset + offset,
                                  elements // block * type_size))
        tensor_at[name] = start
    return tuple(tensors), tensor_at
