"""Write a GGUF with a model config's shapes and deterministic random weights, blocks written directly.

What it is for: kerneltriage and llama.cpp reading the same quantized file on a machine without network (an 8B
in Q4_0 on the GPU machine). Timing does not depend on the weights' values, so no float model is ever made: each
tensor's blocks are bytes taken from one random pool (from an offset of its own), their scales then set so that
the values are ≈ N(0, INIT_STD), as the presets' float weights are. One tensor is in memory at a time.

The vocabulary is synthetic and sentencepiece-shaped (`tokenizer.ggml.model` "llama", llama.cpp's SPM): `<unk>`,
`<s>`, `</s>`, the 256 byte tokens `<0x00>`…`<0xFF>` (llama.cpp spells any text through them) and made-up pieces
with falling scores, so that both llama.cpp and transformers' GGUF conversion build a tokenizer from it.

`write_like` takes the shapes and every metadata key (architecture, tokenizer) from another GGUF instead — a real
model's vocabulary with random weights, for workloads that need its tokens (a grammar's masks over Gemma-3's 262k
vocabulary). Its tensors are never read, so `write_metadata`'s copy of the file without them (a few MB) serves as
well on a machine that cannot receive the weights.
"""

from __future__ import annotations

import itertools
import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
from gguf import (GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType,
                  TokenType)

from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.gguf_header import read_header
from kerneltriage.engine.rope import rope_inv_freq
from kerneltriage.engine.validate import expected_shapes

INIT_STD = 0.02  # the presets' float weights: N(0, 0.02) (backends' load.py)
SEED = 0
POOL_BYTES = (1 << 24) + 4099  # random bytes every tensor tiles; odd, so rows of a tensor start at shifting phases
FILE_TYPES = {"Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1, "Q8_0": LlamaFileType.MOSTLY_Q8_0}
TYPES = tuple(FILE_TYPES)
# Per block: bytes before the quants (fp16 d, and Q4_1's fp16 m) and the spread of its quants' values around their
# centre (uniform 4-bit q − 8: 4.61; uniform int8: 73.9), so that d = INIT_STD / spread.
_HEAD = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2}
_SPREAD = {"Q4_0": 4.61, "Q4_1": 4.61, "Q8_0": 73.9}
SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: llama.cpp's SPM defaults
# Keys a copied file gets anew (the writer's own, the new name and block type); TIED records, in a metadata-only copy,
# that the model had no separate output tensor (its tensor table, which says so, is not copied)
WRITTEN_KEYS = ("general.architecture", "general.name", "general.file_type", "general.quantization_version")
TIED = "kerneltriage.tied_embeddings"
ROPE_FREQS = "kerneltriage.rope_freqs"  # in a metadata-only copy, the `rope_freqs` tensor's values (Llama-3 scaling)
UNK, BOS, EOS = 0, 1, 2


@dataclass(frozen=True)
class Written:
    """What `write_gguf` wrote: the file, its bytes and its tensor count."""

    path: Path
    size_bytes: int
    tensors: int


Field = tuple[str, Any, GGUFValueType, Optional[GGUFValueType]]  # key, value, type, an array's item type


def write_gguf(config: ModelConfig, qtype: str, path: Path, name: str | None = None,
               fields: list[Field] | None = None, rope_freqs: np.ndarray | None = None) -> Written:
    """A GGUF at `path` with `config`'s shapes: matrices as `qtype` blocks of random values, norms at 1, rope
    factors where the config scales rope (or `rope_freqs` as given); metadata from `config` and a synthetic
    vocabulary, or `fields` (another file's keys) as they are. Written to a temporary name and renamed: never half a
    file."""
    if qtype not in FILE_TYPES:
        raise InputError(f"GGUF type {qtype!r}: expected one of {', '.join(TYPES)}")
    path = Path(path)
    shapes = _tensor_shapes(config, qtype)
    fixed = {}
    if rope_freqs is not None:
        fixed[names.from_internal("rope_freqs", names.GGUF)] = np.asarray(rope_freqs, dtype=np.float32)
        shapes.update({tensor: (values.shape, "F32") for tensor, values in fixed.items()})
    name = name or f"{config.name or config.arch}-random-{qtype}"

    def metadata(writer: GGUFWriter) -> None:
        if fields is None:
            _add_metadata(writer, config, qtype, name)
            return
        writer.add_name(name)
        writer.add_file_type(FILE_TYPES[qtype])
        writer.add_quantization_version(2)
        for key, value, vtype, sub in fields:
            writer.add_key_value(key, value, vtype, sub)

    return _write(path, config.arch, metadata, shapes, config, fixed)


def write_like(source: Path, qtype: str, path: Path) -> Written:
    """A GGUF with `source`'s shapes and every metadata key of it (its tokenizer too), matrices as random `qtype`
    blocks. `source` may be a metadata-only copy (`write_metadata`)."""
    fields, meta = _fields(source)
    tied = bool(meta.get(TIED)) if TIED in meta else "output.weight" not in _tensor_names(source)
    config = ModelConfig.from_gguf(meta, not tied, name=Path(source).stem)
    rope = meta.get(ROPE_FREQS, _rope_tensor(source))
    fields = [f for f in fields if f[0] not in (TIED, ROPE_FREQS, "general.architecture")]  # the writer sets the last
    return write_gguf(config, qtype, path, name=f"{config.name}-random-{qtype}", fields=fields,
                      rope_freqs=None if rope is None else np.asarray(rope, dtype=np.float32))


def write_metadata(source: Path, path: Path) -> Written:
    """A copy of `source`'s metadata with no tensors (and whether its embeddings were tied): what `write_like` needs
    of a model, without its weights."""
    fields, _ = _fields(source)
    tied = "output.weight" not in _tensor_names(source)
    rope = _rope_tensor(source)
    arch = next(value for key, value, _, _ in fields if key == "general.architecture")
    kept = [f for f in fields if f[0] not in ("general.architecture",)]

    def metadata(writer: GGUFWriter) -> None:
        for key, value, vtype, sub in kept:
            writer.add_key_value(key, value, vtype, sub)
        writer.add_bool(TIED, tied)
        if rope is not None:
            writer.add_array(ROPE_FREQS, [float(v) for v in rope])

    return _write(Path(path), arch, metadata, {}, None, {})


def _fields(source: Path) -> tuple[list[Field], dict[str, Any]]:
    """Every metadata key of `source` with its GGUF types (those the writer sets itself left out, but for the
    architecture), and the same as plain values."""
    source = Path(source)
    meta = read_header(source).meta  # checks the file (one line on a bad one) before gguf's reader maps it
    fields: list[Field] = []
    for field in GGUFReader(source).fields.values():
        if field.name.startswith("GGUF.") or (field.name in WRITTEN_KEYS and field.name != "general.architecture"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        fields.append((field.name, field.contents(), vtype, sub))
    return fields, meta


def _tensor_names(source: Path) -> set[str]:
    return {t.name for t in read_header(Path(source)).tensors}


def _rope_tensor(source: Path) -> np.ndarray | None:
    """The values of `source`'s `rope_freqs` tensor (float32), or None where it has none."""
    from kerneltriage.engine.gguf_file import read_gguf

    tensor = names.from_internal("rope_freqs", names.GGUF)
    if tensor not in _tensor_names(source):
        return None
    return np.asarray(read_gguf(Path(source)).tensors[tensor].data, dtype=np.float32).copy()


def _write(path: Path, arch: str, metadata: Callable[[GGUFWriter], None],
           shapes: dict[str, tuple[tuple[int, ...], str]], config: ModelConfig | None,
           fixed: dict[str, np.ndarray]) -> Written:
    if not path.parent.is_dir():
        raise InputError(f"{path}: its folder {path.parent} does not exist")
    partial = path.with_name(f".{path.name}.partial")
    writer = GGUFWriter(partial, arch)
    try:
        metadata(writer)
        for tensor_name, (shape, kind) in shapes.items():
            if kind == "F32":
                writer.add_tensor_info(tensor_name, shape, np.dtype(np.float32), _nbytes(shape, kind))
            else:  # a quantized tensor is declared by its bytes: (rows, bytes per row)
                writer.add_tensor_info(tensor_name, (shape[0], _nbytes(shape[1:], kind)), np.dtype(np.uint8),
                                       _nbytes(shape, kind), GGMLQuantizationType[kind])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        pool = np.random.default_rng(SEED).integers(0, 256, POOL_BYTES, dtype=np.uint8)
        for index, (tensor_name, (shape, kind)) in enumerate(shapes.items()):
            assert config is not None  # shapes come from a config
            data = fixed.get(tensor_name)
            writer.write_tensor_data(data if data is not None else _tensor(config, tensor_name, shape, kind, pool,
                                                                           index))
        writer.close()
        os.replace(partial, path)
    finally:  # an error (or Ctrl-C) leaves no partial file behind; after the rename there is none to remove
        writer.close()
        partial.unlink(missing_ok=True)
    return Written(path, path.stat().st_size, len(shapes))


def _tensor_shapes(config: ModelConfig, qtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """GGUF name → (shape, type) of every weight of the model: matrices in `qtype`, 1-D tensors (norms, rope
    factors) in F32."""
    shapes = dict(expected_shapes(config))
    if config.rope_scaling is not None:
        shapes["rope_freqs"] = (config.head_dim // 2,)
    block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
    out = {}
    for internal, shape in shapes.items():
        tensor_name = names.from_internal(internal, names.GGUF)
        if len(shape) == 2 and shape[-1] % block:
            raise InputError(f"{config.name or config.arch}: tensor {tensor_name}'s rows of {shape[-1]} values are "
                             f"not whole {qtype} blocks of {block}")
        out[tensor_name] = (shape, qtype if len(shape) == 2 else "F32")
    return out


def _nbytes(shape: tuple[int, ...], kind: str) -> int:
    """Bytes of a tensor of `shape` in `kind` (whole blocks along its last axis)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    return int(np.prod(shape[:-1], dtype=np.int64)) * shape[-1] // block * size


def _tensor(config: ModelConfig, tensor_name: str, shape: tuple[int, ...], kind: str, pool: np.ndarray,
            index: int) -> np.ndarray:
    """The tensor's bytes (quantized: (rows, bytes per row) uint8) or values (F32)."""
    if tensor_name == names.from_internal("rope_freqs", names.GGUF):
        return _rope_factors(config)
    if kind == "F32":
        return np.ones(shape, dtype=np.float32)
    data = _tiled(pool, (index * 7_919_993) % POOL_BYTES, _nbytes(shape, kind))  # a prime stride between tensors
    blocks = data.reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1])  # (n_blocks, bytes per block)
    _set_scales(blocks, kind)
    return data.reshape(shape[0], -1) if len(shape) == 2 else data


def _tiled(pool: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    """`nbytes` bytes of the pool read cyclically from `start` (copies of whole runs, no index arrays)."""
    out = np.empty(nbytes, dtype=np.uint8)
    done = 0
    while done < nbytes:
        run = min(nbytes - done, len(pool) - start)
        out[done:done + run] = pool[start:start + run]
        done, start = done + run, 0
    return out


def _set_scales(blocks: np.ndarray, kind: str) -> None:
    """Each block's d from its first byte (a spread of 0.5–1.5 × INIT_STD / spread); Q4_1's m = −8·d, so that its
    values d·q + m are centred as Q4_0's d·(q − 8) are."""
    table = (INIT_STD / _SPREAD[kind] * (0.5 + np.arange(256) / 256)).astype(np.float16)  # byte → d
    d = table[blocks[:, 0]]  # (n_blocks,)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    if kind == "Q4_1":
        blocks[:, 2:4] = (-8 * d).astype(np.float16).view(np.uint8).reshape(-1, 2)


def _rope_factors(config: ModelConfig) -> np.ndarray:
    """llama.cpp's `rope_freqs`: per frequency, the divisor Llama-3 scaling applies (unscaled / scaled)."""
    plain = rope_inv_freq(config.replace(rope_scaling=None)).astype(np.float64)
    return (plain / rope_inv_freq(config).astype(np.float64)).astype(np.float32)


def _add_metadata(writer: GGUFWriter, config: ModelConfig, qtype: str, name: str) -> None:
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_quantization_version(2)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_context)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_layers)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_eps)
    _add_vocabulary(writer, config.vocab_size)


def _add_vocabulary(writer: GGUFWriter, size: int) -> None:
    """A sentencepiece vocabulary of `size` tokens: specials, bytes, then pieces (SPM merges by score: higher first)."""
    tokens = synthetic_vocabulary(size)
    types = ([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
             + [TokenType.NORMAL] * (size - 259))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_merges(_merges(tokens))
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(size - 259)])
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def synthetic_vocabulary(size: int) -> list[str]:
    """`size` distinct tokens: `<unk>`, `<s>`, `</s>`, `<0x00>`…`<0xFF>`, then pieces `▁`, `▁a`, `a`, … `▁aa`, …"""
    fixed = [*SPECIAL, *(f"<0x{byte:02X}>" for byte in range(256))]
    if size < len(fixed):
        raise InputError(f"vocabulary of {size} tokens: a synthetic one needs at least {len(fixed)} (specials and "
                         "the 256 byte tokens)")
    return fixed + list(itertools.islice(_pieces(), size - len(fixed)))


def _merges(tokens: list[str]) -> list[str]:
    """Each piece as its prefix and last character, shorter pieces first. llama.cpp's SPM tokenizer merges by score
    and reads none of these; transformers' conversion would otherwise derive them from the vocabulary (a minute for
    128k tokens)."""
    known = set(tokens)
    pieces = tokens[len(SPECIAL) + 256:]
    return [f"{p[:-1]} {p[-1]}" for p in pieces if len(p) > 1 and p[:-1] in known and p[-1] in known]


def _pieces() -> Iterator[str]:
    """`▁` (sentencepiece's space, which every word start merges from), then lower-case words in order of length,
    each as a word start (`▁word`) and as a continuation (`word`)."""
    yield "\u2581"
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            word = "".join(letters)
            yield "\u2581" + word
            yield word
