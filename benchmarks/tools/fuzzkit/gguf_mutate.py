"""Mutations of a GGUF file's header, aimed at its fields: a value, a value type, a count, a tensor's type,
shape or offset, a cut. Used by the targeted validation tests and by the fuzz run (tests and benchmarks).

Offsets come from parsing the pristine file (`read_header`'s `value_type_at` / `tensor_at`); every mutation
is a pure function of (file bytes, header, random generator), so a seed reproduces a case.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Callable, Iterator

from gguf import GGUFValueType

from kerneltriage.engine.gguf_header import GGUFHeader

# struct codes of GGUF's scalar value types, by type id
SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# Values a field is rewritten to: zero, huge, negative, not finite — what one flipped byte or a bad tool gives.
SPECIAL_INTS = (0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2_949_150, 3)
SPECIAL_FLOATS = (0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e38, 1e-45)


@dataclass(frozen=True)
class Mutant:
    """A mutated file's bytes and a one-line description of what was done."""

    data: bytes
    what: str


def value_type(data: bytes, header: GGUFHeader, key: str) -> int:
    return struct.unpack_from("<I", data, header.value_type_at[key])[0]


def set_scalar(data: bytes, header: GGUFHeader, key: str, value: float) -> bytes:
    """`key`'s scalar value rewritten in place, in its own type."""
    at = header.value_type_at[key]
    code = SCALAR_CODES[value_type(data, header, key)]
    out = bytearray(data)
    struct.pack_into("<" + code, out, at + 4, value)
    return bytes(out)


def set_value_type(data: bytes, header: GGUFHeader, key: str, type_id: int) -> bytes:
    out = bytearray(data)
    struct.pack_into("<I", out, header.value_type_at[key], type_id)
    return bytes(out)


def tensor_fields(data: bytes, header: GGUFHeader, name: str) -> dict[str, int]:
    """Byte offsets of a tensor entry's fields: n_dims, dims (the first), type, offset."""
    at = header.tensor_at[name]
    name_len = struct.unpack_from("<Q", data, at)[0]
    n_dims_at = at + 8 + name_len
    n_dims = struct.unpack_from("<I", data, n_dims_at)[0]
    type_at = n_dims_at + 4 + 8 * n_dims
    return {"n_dims": n_dims_at, "dims": n_dims_at + 4, "type": type_at, "offset": type_at + 4}


def set_tensor_field(data: bytes, header: GGUFHeader, name: str, field: str, value: int) -> bytes:
    at = tensor_fields(data, header, name)[field]
    out = bytearray(data)
    struct.pack_into("<Q" if field in ("dims", "offset") else "<I", out, at, value)
    return bytes(out)


def rename_key(data: bytes, header: GGUFHeader, key: str, new: str) -> bytes:
    """Metadata `key` renamed in place to `new`, of the same length (what a flipped byte in its name does)."""
    return _rename(data, header.value_type_at[key] - len(key.encode()), key, new)


def rename_tensor(data: bytes, header: GGUFHeader, name: str, new: str) -> bytes:
    """Tensor `name` renamed in place to `new`, of the same length."""
    return _rename(data, header.tensor_at[name] + 8, name, new)


def _rename(data: bytes, at: int, old: str, new: str) -> bytes:
    assert len(new.encode()) == len(old.encode()) and data[at:at + len(old.encode())] == old.encode()
    return data[:at] + new.encode() + data[at + len(new.encode()):]


def _scalar_keys(data: bytes, header: GGUFHeader) -> list[str]:
    return [k for k in header.meta if value_type(data, header, k) in SCALAR_CODES]


def _rewrite_value(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    key = rng.choice(_scalar_keys(data, header))
    floating = SCALAR_CODES[value_type(data, header, key)] in "fd"
    value = rng.choice(SPECIAL_FLOATS if floating else SPECIAL_INTS)
    code = SCALAR_CODES[value_type(data, header, key)]
    if code == "?":
        value = bool(value)
    try:
        return Mutant(set_scalar(data, header, key, value), f"{key} = {value!r}")
    except struct.error:  # the special value does not fit this type (e.g. 2^32-1 in an int8): wrap it
        return Mutant(set_scalar(data, header, key, int(value) % 2 ** (8 * struct.calcsize(code) - 1)),
                      f"{key} = {value!r} (wrapped)")


def _rewrite_type(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    key = rng.choice(list(header.meta))
    type_id = rng.choice([*(int(t) for t in GGUFValueType), 13, 255])
    return Mutant(set_value_type(data, header, key, type_id), f"{key}: value type → {type_id}")


def _flip_in(data: bytes, start: int, end: int, rng: random.Random, where: str) -> Mutant:
    at = rng.randrange(start, end)
    bit = 1 << rng.randrange(8)
    out = bytearray(data)
    out[at] ^= bit
    return Mutant(bytes(out), f"bit {bit:#04x} flipped at byte {at} ({where})")


def _flip_metadata(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    """A flip inside one non-tokenizer metadata entry (its type or value: what the model is built from)."""
    keys = [k for k in header.meta if not k.startswith("tokenizer.")]
    key = rng.choice(keys)
    ordered = sorted(header.value_type_at.values())
    at = header.value_type_at[key]
    following = [o for o in ordered if o > at]
    end = min(following[0] if following else at + 16, at + 4 + 16)
    return _flip_in(data, at, end, rng, f"metadata {key}")


def _flip_header(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    return _flip_in(data, 0, header.data_offset, rng, "anywhere in the header")


def _flip_tensor_entry(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    name = rng.choice(list(header.tensor_at))
    fields = tensor_fields(data, header, name)
    return _flip_in(data, fields["n_dims"], fields["offset"] + 8, rng, f"tensor entry {name}")


def _rewrite_tensor(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    name = rng.choice(list(header.tensor_at))
    field = rng.choice(["type", "type", "offset", "dims", "n_dims"])
    if field == "type":
        value = rng.choice([0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30, 99])
    elif field == "offset":
        info = next(t for t in header.tensors if t.name == name)
        value = max(0, info.offset - header.data_offset + rng.choice([-64, -32, -1, 1, 16, 32, 4096, 2**40]))
    else:
        value = rng.choice(SPECIAL_INTS) % 2 ** (64 if field == "dims" else 32)  # as the field's width holds it
    return Mutant(set_tensor_field(data, header, name, field, value), f"tensor {name}: {field} → {value}")


def _count(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    """The tensor count, the metadata count or an array's length rewritten."""
    arrays = [k for k in header.meta if value_type(data, header, k) == int(GGUFValueType.ARRAY)]
    choice = rng.choice(["tensors", "kv", *(["array"] if arrays else [])])
    value = rng.choice([0, 1, 2**20, 2**32 + 1, 2**63 - 1])
    out = bytearray(data)
    if choice == "array":
        key = rng.choice(arrays)
        struct.pack_into("<Q", out, header.value_type_at[key] + 8, value)
        return Mutant(bytes(out), f"length of array {key} → {value}")
    struct.pack_into("<Q", out, 8 if choice == "tensors" else 16, value)
    return Mutant(bytes(out), f"{choice} count → {value}")


def _truncate(data: bytes, header: GGUFHeader, rng: random.Random) -> Mutant:
    cut = rng.choice([rng.randrange(0, header.data_offset), rng.randrange(header.data_offset, len(data))])
    return Mutant(data[:cut], f"truncated to {cut} of {len(data)} bytes")


STRATEGIES: dict[str, Callable[[bytes, GGUFHeader, random.Random], Mutant]] = {
    "value": _rewrite_value, "value-type": _rewrite_type, "flip-metadata": _flip_metadata,
    "flip-header": _flip_header, "flip-tensor-entry": _flip_tensor_entry, "tensor-field": _rewrite_tensor,
    "count": _count, "truncate": _truncate,
}


def mutants(data: bytes, header: GGUFHeader, count: int, seed: int) -> Iterator[Mutant]:
    """`count` mutants, made one at a time (a real model's are 98 MB each), strategies taken in turn, each
    case's randomness from (seed, case index)."""
    names = list(STRATEGIES)
    for index in range(count):
        rng = random.Random(f"{seed}:{index}")
        strategy = names[index % len(names)]
        mutant = STRATEGIES[strategy](data, header, rng)
        yield Mutant(mutant.data, f"{strategy}: {mutant.what}")
